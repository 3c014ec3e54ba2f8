"""The two thin shells over the session: the pytest plugin and the command line, sharing one declaration of
options."""
