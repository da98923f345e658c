"""Textual TUI and the typer CLI; talks to a tapdeck server over HTTP."""
