"""One module per `tapdeck` CLI command; each exposes `register(app)`."""
