"""The typed contract between tapdeck's server and its clients (no Textual, no Harbor)."""
