"""Capture sessions: keys, what opens one, the live state of each, the registry and its reads."""
