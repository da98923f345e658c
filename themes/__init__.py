"""Textual themes (as data, in `palettes`) and tapdeck's stylesheet."""

from pathlib import Path

STYLESHEET = Path(__file__).with_name("tapdeck.tcss")
"""The app-wide stylesheet; widgets keep their own DEFAULT_CSS beside them."""
