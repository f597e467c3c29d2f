"""What a check reports: console table, report.json, report.md, junit.xml, the action-difference plot, baselines."""
