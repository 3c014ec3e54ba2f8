"""What people read: tables fitted to 120 columns, the Markdown report, plots and progress lines."""
