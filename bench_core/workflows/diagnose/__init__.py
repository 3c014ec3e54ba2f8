"""Diagnose: a profiler pass kept apart from measurement, and what its trace says."""
