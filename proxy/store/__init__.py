"""Durable capture: the SQLite store, its writer threads, and files replaced whole."""
