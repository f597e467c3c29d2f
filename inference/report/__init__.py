"""What a check reports: report.json, report.md, junit.xml, the action-difference plot, baselines."""
