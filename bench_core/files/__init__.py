"""The only I/O: every on-disk format (storage), the machine's environment record, git, and the
pytest-benchmark export. Imports only the core."""
