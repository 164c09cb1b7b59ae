"""Textual screens (the app arrives with the Textual app issue)."""
