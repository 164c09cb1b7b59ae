"""tuishell's Textual themes (`.tcss`), installed as the package `tuishell.themes`."""
