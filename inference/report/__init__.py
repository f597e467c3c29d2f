"""What a check reports: report.json, report.html, report.md, junit.xml, the plots, baselines; and
``python -m inference.report diff OLD NEW`` to compare two runs."""
