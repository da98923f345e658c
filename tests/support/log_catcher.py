"""A log handler that keeps every record of tapdeck failing, for tests that must see none."""

from __future__ import annotations

import logging
import traceback


class TracebackCatcher(logging.Handler):
    """Every log record, from any logger, that carries a traceback or an error."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.bad: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info or "Traceback" in text or record.levelno >= logging.ERROR:
            # The whole traceback: a fuzz test's reported example may be a later one (the log is
            # checked per test, not per example), so the trace is what names the failing input.
            trace = "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else ""
            self.bad.append(f"{record.name}: {text}\n{trace}")
