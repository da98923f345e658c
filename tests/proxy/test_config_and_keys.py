"""Config, admin-key file, session keys and the event bus: the small pieces the server stands on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import threading
from pathlib import Path

import pytest

from tapdeck.proxy.config import (
    ConfigError,
    ServerConfig,
    admin_key_weakness,
    check_bind,
    is_loopback,
    new_admin_key,
    read_admin_key,
    read_key_file,
    secure_data_dir,
    unsendable_admin_key,
    write_admin_key,
)
from tapdeck.proxy.http.events import EventBus
from tapdeck.proxy.sessions.keys import is_session_key, key_from_request, new_session_key


def test_admin_key_file_is_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "d" / "admin.key"
    write_admin_key(path, "tdk-admin-abc")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_admin_key(tmp_path / "d") == "tdk-admin-abc"


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "example.org"])
def test_non_loopback_bind_without_explicit_admin_key_is_refused(host: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--admin-key"):
        check_bind(ServerConfig(host=host, data_dir=tmp_path))
    check_bind(ServerConfig(host=host, data_dir=tmp_path, admin_key=STRONG))


STRONG = "Zq3-chosen-by-the-operator-x7Kp"


@pytest.mark.parametrize("key", ["x", "hunter2", "a" * 40, "abcabcabcabcabcabcabcabcabcabc", "Short-1"])
def test_a_weak_admin_key_is_refused_on_a_public_bind_only(key: str, tmp_path: Path) -> None:
    assert admin_key_weakness(key)
    with pytest.raises(ConfigError, match="weak admin key"):
        check_bind(ServerConfig(host="0.0.0.0", data_dir=tmp_path, admin_key=key))
    check_bind(ServerConfig(host="127.0.0.1", data_dir=tmp_path, admin_key=key))
    assert admin_key_weakness(new_admin_key()) is None


@pytest.mark.parametrize("key", ["clé-chosen-by-the-operator-x7Kp", "two words", "tab\tkey"])
def test_an_admin_key_no_client_can_send_is_refused_on_any_bind(key: str, tmp_path: Path) -> None:
    for host in ("127.0.0.1", "0.0.0.0"):
        with pytest.raises(ConfigError, match="must be printable ASCII without spaces"):
            check_bind(ServerConfig(host=host, data_dir=tmp_path, admin_key=key))
    path = tmp_path / "admin.key"
    path.write_text(key + "\n")
    with pytest.raises(ValueError, match=f"admin key in {path} must be printable ASCII"):
        read_admin_key(tmp_path)
    path.write_bytes(b"\xff\xfe\n")
    with pytest.raises(ValueError, match=f"admin key in {path} must be printable ASCII"):
        read_key_file(path)
    assert unsendable_admin_key(new_admin_key(), "given") is None


def test_admin_key_temp_file_is_never_followed(tmp_path: Path, monkeypatch) -> None:
    # The temporary name is random; a link planted where it will be (here: the name made known)
    # is refused by its name, never written through.
    import tapdeck.proxy.store.atomic_write as atomic_write

    monkeypatch.setattr(atomic_write.secrets, "token_hex", lambda n: "0" * 2 * n)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (tmp_path / ".admin.key.00000000.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError, match="admin.key"):
        write_admin_key(tmp_path / "admin.key", "tdk-admin-new")
    assert victim.read_text() == "untouched\n"
    assert not (tmp_path / "admin.key").exists()


def test_admin_key_file_is_owner_only_from_creation_even_over_a_readable_one(
    tmp_path: Path, monkeypatch
) -> None:
    path = tmp_path / "admin.key"
    path.write_text("tdk-admin-old\n")
    path.chmod(0o644)
    created: list[int] = []  # each new file's mode the moment it exists, before its content
    real_open = os.open

    def recording_open(name, flags, mode=0o777, **kw):
        fd = real_open(name, flags, mode, **kw)
        if flags & os.O_CREAT:
            created.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return fd

    monkeypatch.setattr(os, "open", recording_open)
    old_umask = os.umask(0)  # nothing narrows a mode asked for too wide
    try:
        write_admin_key(path, "tdk-admin-new")
    finally:
        os.umask(old_umask)
    assert created == [0o600]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_admin_key(tmp_path) == "tdk-admin-new"
    assert [p.name for p in tmp_path.iterdir()] == ["admin.key"]


def test_data_dir_and_capture_db_are_owner_only_even_when_they_existed(tmp_path: Path) -> None:
    config = ServerConfig(data_dir=tmp_path / "data")
    config.data_dir.mkdir(mode=0o755)
    config.capture_db.write_bytes(b"")
    config.capture_db.chmod(0o644)
    secure_data_dir(config)
    assert stat.S_IMODE(os.stat(config.data_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(config.capture_db).st_mode) == 0o600
    fresh = ServerConfig(data_dir=tmp_path / "fresh" / "data")
    secure_data_dir(fresh)
    assert stat.S_IMODE(os.stat(fresh.data_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(fresh.capture_db).st_mode) == 0o600


def test_admin_key_file_is_read_and_refused_when_empty(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(STRONG + "\n")
    assert read_key_file(path) == STRONG
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_key_file(path)
    with pytest.raises(ValueError, match="cannot read"):
        read_key_file(tmp_path / "missing")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.5.5.5", "::1", "localhost"])
def test_loopback_binds_need_no_admin_key(host: str, tmp_path: Path) -> None:
    assert is_loopback(host)
    check_bind(ServerConfig(host=host, data_dir=tmp_path))


def test_data_dir_defaults_to_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TAPDECK_DATA_DIR", str(tmp_path))
    assert ServerConfig().data_dir == tmp_path
    assert ServerConfig().capture_db == tmp_path / "capture.db"


def test_session_keys_are_unguessable_and_charset_checked() -> None:
    keys = {new_session_key() for _ in range(200)}
    assert len(keys) == 200
    assert all(is_session_key(k) for k in keys)
    key = next(iter(keys))
    for bad in ("", "tdk-", key + "x", key[:-1] + "!", key.replace("tdk-", "sk-"), "tdk-" + "a" * 43 + "\n"):
        assert not is_session_key(bad)


@pytest.mark.parametrize(
    "headers,query",
    [
        ({"authorization": "Bearer K"}, {}),
        ({"authorization": "bearer   K "}, {}),
        ({"x-api-key": "K"}, {}),
        ({"x-goog-api-key": "K"}, {}),
        ({}, {"key": "K"}),
    ],
)
def test_key_is_read_from_every_provider_location(headers: dict, query: dict) -> None:
    assert key_from_request(headers, query) == "K"


def test_no_key_anywhere_is_none() -> None:
    assert key_from_request({"authorization": "Basic abc"}, {}) is None


async def test_event_bus_delivers_in_order_and_from_other_threads() -> None:
    bus = EventBus()
    got: list[dict] = []

    async def consume() -> None:
        async with contextlib.aclosing(bus.subscribe()) as events:
            async for event in events:
                got.append(event)
                if len(got) == 3:
                    return

    task = asyncio.create_task(consume())
    while bus.subscriber_count == 0:
        await asyncio.sleep(0.001)
    bus.publish({"type": "a"})
    thread = threading.Thread(target=bus.publish, args=({"type": "b"},))
    thread.start()
    thread.join()

    async def delivered(n: int) -> None:
        while len(got) < n:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(delivered(2), 5)  # a publish from another thread lands a turn later
    bus.publish({"type": "c"})
    await asyncio.wait_for(task, 5)
    assert [e["type"] for e in got] == ["a", "b", "c"]
    assert bus.subscriber_count == 0


async def test_event_given_as_function_is_built_only_when_someone_listens() -> None:
    bus = EventBus()
    built: list[str] = []

    def event(name: str):
        def build() -> dict:
            built.append(name)
            return {"type": name}

        return build

    bus.publish(event("unheard"))
    assert built == []
    agen = bus.subscribe()
    first = asyncio.ensure_future(anext(agen))
    while bus.subscriber_count == 0:
        await asyncio.sleep(0.001)
    bus.publish(event("heard"))
    assert (await asyncio.wait_for(first, 5))["type"] == "heard"
    assert built == ["heard"]
    await agen.aclose()


async def test_slow_event_subscriber_loses_oldest_not_memory() -> None:
    bus = EventBus(limit=5)
    agen = bus.subscribe()
    first = asyncio.ensure_future(anext(agen))
    await asyncio.sleep(0)
    for i in range(20):
        bus.publish({"type": "n", "i": i})
    got = [(await first)["i"]] + [(await anext(agen))["i"] for _ in range(4)]
    assert got == [15, 16, 17, 18, 19]
    await agen.aclose()
