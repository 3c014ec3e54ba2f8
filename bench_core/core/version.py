"""The package's version: one place, read by the environment record and by packaging."""
__version__ = "0.4.0.dev0"
