"""Textual themes and stylesheets."""
