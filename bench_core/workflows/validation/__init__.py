"""Validation of an optimization: the saved starting state and the correctness checks from it."""
