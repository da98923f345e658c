"""Widgets of the operator TUI."""
