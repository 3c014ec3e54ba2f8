"""Deciding from samples, pure: the stored-baseline gate, slow processes, the rounds decision, the paired
decision, the keep-going rule and the verdicts with their meanings. Imports only the core; no torch."""
