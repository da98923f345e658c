"""Fixtures for the agent CLI tests: a scripted engine with a capture server in front (`scripted`,
`upstream`, `capture`, from tests/support/capture_server.py)."""

from tests.support.capture_server import capture, scripted, upstream  # noqa: F401  (fixtures)
