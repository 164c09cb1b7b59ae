"""tuishell: a sandboxed agent shell for the terminal."""

__version__ = "0.1.0"
