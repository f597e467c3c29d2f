"""Seeded feeds, comparison statistics, episode replay and the result types verify reports."""
