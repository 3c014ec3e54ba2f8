"""Distributed scenarios: the launcher in the session's process and the program in every rank."""
