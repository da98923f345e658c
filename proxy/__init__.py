"""Capture proxy: dialects, engine client, sessions, rollout graph, store, export, validation.

Imports nothing from tapdeck.runner, tapdeck.app, tapdeck.themes, textual or harbor."""
