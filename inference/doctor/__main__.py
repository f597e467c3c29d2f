"""``python -m inference.doctor``."""

from inference.doctor import cli

if __name__ == "__main__":
    cli()
