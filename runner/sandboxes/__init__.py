"""Sandboxes tapdeck adds to Harbor's backends."""
