"""Human- and machine-readable results: console tables, JSON/Markdown/JUnit reports, plots."""
