"""A file replaced whole or not at all.

Export files are read by other programs while tapdeck may be rewriting them (a trainer polling a
run's rows), and an export can fail half-way (a full disk, Ctrl-C). So the new content goes to a
hidden temporary file beside the target and is renamed over it once complete: a reader sees the
old file or the new one, never part of one, and a failed write leaves the old file as it was. The
same holds for every file tapdeck replaces whole (settings, run records, the admin key), so each
uses this one function rather than a temporary name of its own, which two writers could share.
None of them is written through a symbolic link (proxy/store/no_follow.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tapdeck.proxy.store.no_follow import refuse_link


def _named(exc: OSError, path: Path) -> OSError:
    """`exc` naming `path` (as the caller gave it) when it names no file or only the temporary
    one, so the error says which file could not be written."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


@contextlib.contextmanager
def atomic_write(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new content to; it replaces `path` when the block ends
    without an exception, and is removed (leaving `path` untouched) when it does not.

    A symbolic link at `path` is refused (LinkRefused), never written through; one planted there
    meanwhile is replaced by the rename, not followed. The new file gets `mode` when given, from
    the moment the temporary file exists (a secret is never readable by others, even briefly);
    else the mode the old file had (a new one the umask's). The temporary file is created anew
    (O_EXCL), so a link planted beside `path` is never written through either. An OSError raised
    here names `path`."""
    refuse_link(path)
    target = Path(path)
    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    except OSError as exc:
        raise _named(exc, path) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)  # exactly `mode`, whatever the umask took away
            yield f
            f.flush()
            os.fsync(f.fileno())  # the content is on disk before the name points at it
        if mode is None:
            with contextlib.suppress(FileNotFoundError):
                os.chmod(temp, stat.S_IMODE(target.stat().st_mode))
        os.replace(temp, target)
    except BaseException as exc:  # Ctrl-C included: no half-written file is left behind
        temp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename in (None, str(temp)):
            raise _named(exc, path) from exc
        raise


__all__ = ["atomic_write"]
