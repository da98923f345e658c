"""The data dir's capture store, opened for a command that works on it without a server: read-only
for one that reads it (`tapdeck export`, `tapdeck sessions`), as a server may be writing it at the
same time; writable for one that adds its own layer beside the capture (`tapdeck replay`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError

if TYPE_CHECKING:
    from tapdeck.proxy.store.database import Store


@contextmanager
def stored_capture(
    data_dir: Path | None, command: str, *, read_only: bool = True
) -> Iterator[tuple[Path, Store]]:
    """The data dir (--data-dir, else the default) and its store, closed afterwards.

    Ends the command, saying why: exit 2 for a data dir that cannot be one, exit 1 when it holds
    no store, or another program's database, or a corrupt one (also when a read inside the block
    finds it corrupt). Nothing is written to a database that is not a store.
    """
    import sqlite3

    from tapdeck.proxy.config import CAPTURE_DB, default_data_dir, usable_data_dir
    from tapdeck.proxy.store.database import NotAStoreError, Store

    try:
        root = usable_data_dir(data_dir or default_data_dir())
    except ValueError as exc:
        raise CommandError(EXIT_USAGE, f"tapdeck {command}: --data-dir: {exc}") from None
    db = root / CAPTURE_DB
    if not db.exists():
        raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck {command}: no capture store at {db}")
    try:
        if not read_only:  # a store, checked before anything is written to it
            Store(db, read_only=True).close()
        store = Store(db, read_only=read_only)
        try:
            yield root, store
        finally:
            store.close()
    except NotAStoreError as exc:  # another program's database: said, and left as it is
        raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck {command}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise CommandError(
            EXIT_COULD_NOT_RUN,
            f"tapdeck {command}: capture.db at {db} is not a tapdeck store or is corrupt ({exc})",
        ) from None
