"""Screens of the operator TUI."""
