"""The TUI's settings file (app/settings.py): saved whole, whoever else saves it at once."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path

from tapdeck.app.settings import Settings


class _SaveBetweenOpenAndWrite:
    """A file opened for writing whose first write lets `between()` run first: another TUI's
    whole save landing after this one opened its file and before it wrote to it."""

    def __init__(self, file, between) -> None:
        self._file, self._between = file, between

    def write(self, data):
        between, self._between = self._between, None
        if between is not None:
            between()
        return self._file.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._file.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._file, name)


def test_two_settings_saves_at_once_leave_one_whole_file_and_no_stray_temp(
    tmp_path: Path, monkeypatch
) -> None:
    path = tmp_path / "tui.json"
    first = Settings(theme="tapdeck-light")
    second = Settings(theme="tapdeck-dark", keymap={f"binding.{i}": "f2" for i in range(20)})
    real_open = io.open
    pending = [lambda: second.save(path)]

    def open_interleaved(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        if "w" in mode and pending:  # the first save's file; the second save runs whole inside
            return _SaveBetweenOpenAndWrite(opened, pending.pop())
        return opened

    monkeypatch.setattr(io, "open", open_interleaved)
    first.save(path)
    monkeypatch.undo()
    assert not pending  # the second save did run inside the first
    assert json.loads(path.read_text()) in (asdict(first), asdict(second))
    assert [p.name for p in tmp_path.iterdir()] == ["tui.json"]
    assert Settings.load(path) in (first, second)
