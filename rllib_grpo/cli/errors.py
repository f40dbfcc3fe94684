"""`ConfigError`: bad user input on the command line."""


class ConfigError(ValueError):
    """Bad user input; the command line prints it as one line and exits 2."""
