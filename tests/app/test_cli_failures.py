"""What the commands answer to bad input and to failures of the world around them: one line, no
traceback, and README's exit codes (1 could not do the work, 2 bad usage). Each case runs the
command line in its own process, as a user does."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tapdeck.app.client import ApiError
from tapdeck.app.failures import describe
from tapdeck.runner.datasets import SAMPLE_DATASET_DIR
from tests.support.harbor_registry import REGISTRY_URL_VAR, registry_knowing_no_dataset
from tests.support.ports import free_port


def tapdeck(*args: str, tmp: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`tapdeck ARGS` through the console script's entry point, with no key or data of the user's
    (`env` adds to or overrides its environment)."""
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("TAPDECK_ADMIN_KEY")}
        | {"TAPDECK_DATA_DIR": str(tmp / "data"), "XDG_CONFIG_HOME": str(tmp / "config"), "COLUMNS": "200"}
        | (env or {})
    )
    return subprocess.run(
        [sys.executable, "-c", "from tapdeck.app.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A loopback port another socket listens on while the block runs."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def one_line(result: subprocess.CompletedProcess) -> str:
    """The single line the command printed on stderr (failing when it printed a traceback)."""
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, result.stdout
    return lines[-1]


@pytest.mark.parametrize(
    "args", [["serve", "--port", "99999"], ["engine", "--port", "-1"], ["tui", "--port", "65536"]]
)
def test_a_port_out_of_range_is_bad_usage(args: list[str], tmp_path: Path) -> None:
    result = tapdeck(*args, tmp=tmp_path)
    assert result.returncode == 2
    assert "Invalid value for '--port'" in one_line(result)


@pytest.mark.medium
@pytest.mark.parametrize(
    ("n_ctx", "why"),
    [
        ("-5", "is below 256, the smallest context served"),
        ("0", "is below 256, the smallest context served"),
        ("1", "is below 256, the smallest context served"),  # was served as 256, unsaid
        ("255", "is below 256, the smallest context served"),
        ("32769", "is past 32768, 4x the 8192 tokens"),
        ("99999999", "is past 32768, 4x the 8192 tokens"),  # was a failed load, exit 1
    ],
)
def test_engine_refuses_a_context_length_it_does_not_serve_as_bad_usage(
    n_ctx: str, why: str, tmp_path: Path
) -> None:
    # Refused from the model's metadata (SmolLM2 was trained at 8,192 tokens) before its weights
    # load, so no engine starts and the port stays free.
    result = tapdeck("engine", "--port", "0", "--n-ctx", n_ctx, tmp=tmp_path)
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith(f"tapdeck engine: --n-ctx {n_ctx} {why}") and line.endswith("give 256 to 32768"), (
        line
    )


@pytest.mark.medium
@pytest.mark.parametrize("threads", ["0", "-3"])
def test_engine_refuses_a_thread_count_below_one_as_bad_usage(threads: str, tmp_path: Path) -> None:
    result = tapdeck("engine", "--port", "0", "--threads", threads, tmp=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        "Error: Invalid value for '--threads': Input should be greater than or equal to 1"
    )


@pytest.mark.medium
def test_engine_refuses_a_port_in_use_and_a_model_that_is_not_a_file_as_bad_usage(tmp_path: Path) -> None:
    with held_port() as port:
        result = tapdeck("engine", "--port", str(port), tmp=tmp_path)
    assert result.returncode == 2
    assert one_line(result).startswith("tapdeck engine: ") and f"port {port}?" in one_line(result)
    result = tapdeck("engine", "--model", str(tmp_path / "none.gguf"), tmp=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == f"tapdeck engine: --model {tmp_path / 'none.gguf'} is not a file"


@pytest.mark.medium
def test_engine_refuses_a_model_file_that_is_not_a_gguf_as_bad_usage(tmp_path: Path) -> None:
    notes = tmp_path / "notes.gguf"
    notes.write_text("not a model\n")
    result = tapdeck("engine", "--model", str(notes), "--port", "0", tmp=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == f"tapdeck engine: --model: llama.cpp could not read {notes} as a GGUF model"


@pytest.mark.medium
@pytest.mark.parametrize("command", ["engine", "serve"])
def test_a_host_that_does_not_resolve_is_named_not_blamed_on_the_port(command: str, tmp_path: Path) -> None:
    result = tapdeck(command, "--host", "nosuchhost.invalid", "--port", "0", tmp=tmp_path)
    assert result.returncode == 2
    line = one_line(result)
    assert "'nosuchhost.invalid' does not resolve" in line and "port" not in line


@pytest.mark.medium
@pytest.mark.parametrize(("command", "args"), [("engine", []), ("serve", ["--engine", "http://127.0.0.1:9"])])
def test_a_host_that_is_not_this_machines_is_named_not_blamed_on_the_port(
    command: str, args: list[str], tmp_path: Path
) -> None:
    # 192.0.2.1 (TEST-NET-1) is no machine's address: the bind fails with EADDRNOTAVAIL. The key
    # is one `serve` accepts beyond loopback.
    result = tapdeck(
        command,
        "--host",
        "192.0.2.1",
        "--port",
        "0",
        *args,
        tmp=tmp_path,
        env={"TAPDECK_ADMIN_KEY": "Zq3-chosen-by-the-operator-x7Kp"},
    )
    assert result.returncode == 2
    assert one_line(result) == (
        f"tapdeck {command}: cannot bind 192.0.2.1:0: 192.0.2.1 is not an address of this machine"
    )


# Port 9 (discard) answers nothing here: a check that reached the server would fail otherwise.
@pytest.mark.medium
@pytest.mark.parametrize(
    "command",
    [
        ["serve"],
        ["rollout"],
        ["train", "--recipe", "data-check", "--rows", "rows.jsonl"],
        ["rollout", "--server", "http://127.0.0.1:9"],
        ["train", "--recipe", "data-check", "--rows", "rows.jsonl", "--server", "http://127.0.0.1:9"],
        ["export", "r1"],
    ],
    ids=["serve", "rollout", "train", "rollout-remote", "train-remote", "export"],
)
def test_a_command_refuses_a_data_dir_that_is_a_file(command: list[str], tmp_path: Path) -> None:
    # One check (the server config's), so every command says it the same way, before any work;
    # with --server the data dir is only where the admin key is looked for, and still refused.
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = tapdeck(*command, "--data-dir", str(afile), tmp=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == f"tapdeck {command[0]}: --data-dir: {afile} is not a directory"


@pytest.mark.medium
def test_serve_refuses_a_data_dir_from_the_environment_that_is_a_file_as_it_does_the_flag(
    tmp_path: Path,
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = tapdeck(
        "serve",
        "--port",
        "0",
        "--engine",
        "http://127.0.0.1:9",
        tmp=tmp_path,
        env={"TAPDECK_DATA_DIR": str(afile)},
    )
    assert result.returncode == 2
    assert one_line(result) == f"tapdeck serve: --data-dir: {afile} is not a directory"


CLIENTS = {
    "attach": ["attach", "http://127.0.0.1:9"],
    "train": ["train", "--list", "--server", "http://127.0.0.1:9"],
    "rollout": ["rollout", "--server", "http://127.0.0.1:9"],
}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("given", ["flag", "env"])
def test_a_client_refuses_an_admin_key_no_request_can_carry_as_bad_usage(
    client: str, given: str, tmp_path: Path
) -> None:
    # Port 9 answers nothing: the key is refused before any request.
    key = "clé-du-serveur"
    result = (
        tapdeck(*CLIENTS[client], "--admin-key", key, tmp=tmp_path)
        if given == "flag"
        else tapdeck(*CLIENTS[client], tmp=tmp_path, env={"TAPDECK_ADMIN_KEY": key})
    )
    assert result.returncode == 2
    assert one_line(result) == (
        f"tapdeck {client}: the admin key from --admin-key or $TAPDECK_ADMIN_KEY "
        "must be printable ASCII without spaces (an HTTP header carries it)"
    )


@pytest.mark.medium
@pytest.mark.parametrize("given", ["flag", "env", "file"])
def test_serve_refuses_an_admin_key_no_client_could_send(given: str, tmp_path: Path) -> None:
    key = "clé-ünïcødé-chosen-by-the-operator"
    key_file = tmp_path / "key.txt"
    key_file.write_text(key + "\n")
    args = ["serve", "--port", "0", "--engine", "http://127.0.0.1:9"]
    result = {
        "flag": lambda: tapdeck(*args, "--admin-key", key, tmp=tmp_path),
        "env": lambda: tapdeck(*args, tmp=tmp_path, env={"TAPDECK_ADMIN_KEY": key}),
        "file": lambda: tapdeck(*args, "--admin-key-file", str(key_file), tmp=tmp_path),
    }[given]()
    assert result.returncode == 2
    where = f"in {key_file}" if given == "file" else "from --admin-key or $TAPDECK_ADMIN_KEY"
    assert one_line(result) == (
        f"tapdeck serve: the admin key {where} must be printable ASCII without "
        "spaces (an HTTP header carries it)"
    )
    assert not (tmp_path / "data" / "capture.db").exists()  # refused before anything was made


@pytest.mark.medium
@pytest.mark.parametrize(
    "command",
    [
        ["train", "--list", "--server", "http://127.0.0.1:9"],
        ["rollout", "--server", "http://127.0.0.1:9"],
        ["serve", "--port", "0", "--engine", "http://127.0.0.1:9", "--admin-key-file"],
    ],
    ids=["train", "rollout", "serve"],
)
def test_an_admin_key_file_that_is_not_utf8_text_is_named(command: list[str], tmp_path: Path) -> None:
    data = tmp_path / "keydir"
    data.mkdir()
    (data / "admin.key").write_bytes(b"\xff\xfe-not-text\n")
    where = [str(data / "admin.key")] if command[0] == "serve" else ["--data-dir", str(data)]
    result = tapdeck(*command, *where, tmp=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        f"tapdeck {command[0]}: the admin key in {data / 'admin.key'} must be "
        "printable ASCII without spaces (an HTTP header carries it)"
    )


@pytest.fixture
def not_tapdeck(tmp_path: Path) -> Iterator[str]:
    """The URL of Python's own `http.server`: answers 404 and 501 with HTML error pages."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.parametrize(
    ("command", "answer"),
    [
        (["attach", "{url}"], "GET /health: {url} answered 404"),
        (["train", "--list", "--server", "{url}"], "GET /admin/train/recipes: {url} answered 404"),
        # Its first request: whether the server still waits for its engine (run_follow.py).
        (["rollout", "--server", "{url}"], "GET /health: {url} answered 404"),
    ],
    ids=["attach", "train", "rollout"],
)
def test_a_server_that_is_not_tapdeck_is_said_in_one_line_not_dumped(
    command: list[str], answer: str, not_tapdeck: str, tmp_path: Path
) -> None:
    result = tapdeck(*[a.format(url=not_tapdeck) for a in command], "--admin-key", "abc", tmp=tmp_path)
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert f"{answer.format(url=not_tapdeck)} with an HTML page; is it a tapdeck server?" in line
    assert "<" not in line


@pytest.mark.medium
def test_serve_says_which_data_dir_it_cannot_create(tmp_path: Path, dead_engine_url: str) -> None:
    (tmp_path / "afile").write_text("x")
    where = tmp_path / "afile" / "data"
    result = tapdeck(
        "serve", "--port", "0", "--engine", dead_engine_url, "--data-dir", str(where), tmp=tmp_path
    )
    assert result.returncode == 1
    assert one_line(result) == f"tapdeck serve: cannot use {where}: Not a directory"


@pytest.mark.medium
def test_serve_refuses_a_public_url_that_is_not_http_in_one_line(tmp_path: Path) -> None:
    result = tapdeck("serve", "--public-url", "ftp://x", tmp=tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line == (
        "tapdeck serve: --public-url: public URL 'ftp://x' must be http://HOST[:PORT] or https://HOST[:PORT]"
    )


@pytest.mark.medium
def test_tui_refuses_a_public_url_and_a_data_dir_it_cannot_use_as_serve_does(tmp_path: Path) -> None:
    result = tapdeck("tui", "--public-url", "ftp://x", tmp=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        "tapdeck: --public-url: public URL 'ftp://x' must be http://HOST[:PORT] or https://HOST[:PORT]"
    )
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = tapdeck("tui", "--data-dir", str(afile), tmp=tmp_path)
    assert result.returncode == 2
    assert f"--data-dir: {afile} is not a directory" in one_line(result)
    with held_port() as port:
        result = tapdeck("tui", "--port", str(port), tmp=tmp_path)
    assert result.returncode == 2
    assert str(port) in one_line(result)


@pytest.mark.medium
@pytest.mark.parametrize("address", ["ftp://x", "127.0.0.1:99999"])
def test_tui_refuses_a_malformed_engine_address_without_first_saying_it_starts(
    address: str, tmp_path: Path
) -> None:
    result = tapdeck("tui", "--engine", address, tmp=tmp_path)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"tapdeck: engine address {address!r}"), lines


@pytest.mark.medium
def test_bare_tapdeck_takes_the_tui_options_as_tui_does(tmp_path: Path, dead_engine_url: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with held_port() as port:
        for options in (
            ["--data-dir", str(afile)],
            ["--public-url", "ftp://x"],
            ["--port", str(port)],
            ["--engine", dead_engine_url, "--engine-model", "m", "--engine-api-key", "k", "--engine-wait=0"],
        ):
            bare, tui = tapdeck(*options, tmp=tmp_path), tapdeck("tui", *options, tmp=tmp_path)
            assert bare.returncode == tui.returncode != 0, (options, bare.stderr)
            # The same line, but for how long each waited on the dead engine (0 or 1 s under load).
            waited = re.compile(r"\(waited \d+ s; --engine-wait\)")
            lines = [waited.sub("(waited N s)", one_line(r)) for r in (bare, tui)]
            assert lines[0] == lines[1], options
    version = tapdeck("--version", tmp=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("tapdeck "), version.stderr


@pytest.mark.medium
def test_a_tui_option_before_a_command_is_refused_naming_where_it_goes(tmp_path: Path) -> None:
    result = tapdeck("--data-dir", str(tmp_path), "runs", tmp=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        "tapdeck: --data-dir before a command is the TUI's; runs takes its "
        "own options after it (tapdeck runs --help lists them)"
    )
    assert tapdeck("runs", "--data-dir", str(tmp_path), tmp=tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("ftp://x", "'ftp://x' is not an http(s) URL"),
        ("127.0.0.1:99999", "port 99999 is out of range (1-65535)"),
        ("127.0.0.1:0", "port 0 is out of range (1-65535)"),
        ("not a url", "'not a url': host 'not a url' is not a host name or IP address"),
    ],
)
def test_info_refuses_an_engine_address_that_is_not_one(address: str, why: str, tmp_path: Path) -> None:
    result = tapdeck("info", "--no-probe", "--engine", address, tmp=tmp_path)
    assert result.returncode == 2
    assert why in one_line(result)


@pytest.mark.medium
def test_train_against_a_server_that_does_not_answer_could_not_do_its_work(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["--list"], ["--recipe", "data-check", "--run", "run-1"]):
        result = tapdeck("train", "--server", url, *args, tmp=tmp_path)
        assert result.returncode == 1
        assert f"tapdeck server at {url} is not reachable" in one_line(result)


def test_train_refuses_a_server_address_that_is_not_a_url(tmp_path: Path) -> None:
    result = tapdeck("train", "--list", "--server", "ftp://x", tmp=tmp_path)
    assert result.returncode == 2
    assert "--server 'ftp://x' is not an http(s) URL" in one_line(result)


def test_export_says_which_out_path_it_cannot_write(tmp_path: Path) -> None:
    from tapdeck.proxy.store.database import Store

    data = tmp_path / "data"
    data.mkdir()
    store = Store(data / "capture.db")
    store.close()
    (data / "runs" / "r1").mkdir(parents=True)
    (data / "runs" / "r1" / "results.jsonl").write_text(
        '{"rollout_id": "r1.g0r0", "task": "t", "group": 0, "index": 0, "ok": true}\n'
    )
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "rows.jsonl"
    result = tapdeck("export", "r1", "--data-dir", str(data), "--out", str(out), tmp=tmp_path)
    assert result.returncode == 1
    assert one_line(result) == (f"tapdeck export: cannot use {out.parent}: it exists and is not a directory")


def test_export_to_a_parquet_file_it_cannot_write_names_it_in_one_line(tmp_path: Path) -> None:
    from tapdeck.proxy.store.database import Store

    data = tmp_path / "data"
    data.mkdir()
    Store(data / "capture.db").close()
    (data / "runs" / "r1").mkdir(parents=True)
    (data / "runs" / "r1" / "results.jsonl").write_text(
        '{"rollout_id": "r1.g0r0", "task": "t", "group": 0, "index": 0, "ok": true}\n'
    )
    # A name the file system takes, but not with the temporary file's prefix and suffix added.
    out = tmp_path / ("r" * 240 + ".parquet")
    result = tapdeck("export", "r1", "--data-dir", str(data), "--out", str(out), tmp=tmp_path)
    assert result.returncode == 1
    assert one_line(result) == f"tapdeck export: cannot use {out}: File name too long"


def test_only_known_failure_kinds_lose_their_traceback() -> None:
    unreachable = ApiError("tapdeck server at http://h:1 is not reachable", kind="unreachable")
    assert describe(unreachable) == unreachable.message
    assert describe(ExceptionGroup("connect", [unreachable])) == unreachable.message
    assert (
        describe(PermissionError(13, "Permission denied", "/root/x"))
        == "cannot use /root/x: Permission denied"
    )
    # A bug in tapdeck keeps its traceback: neither a plain error nor an OSError naming no file.
    for bug in (
        KeyError("x"),
        ValueError("x"),
        OSError("x"),
        ExceptionGroup("g", [unreachable, TypeError()]),
    ):
        assert describe(bug) is None


@pytest.mark.medium
def test_info_lists_the_good_tasks_and_warns_naming_each_task_toml_it_cannot_parse(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    shutil.copytree(SAMPLE_DATASET_DIR, dataset)
    (dataset / "greet-script" / "task.toml").write_text("this is [not toml\n")
    (dataset / "hello-file" / "task.toml").write_text('version = "1.0"\n[task]\nname = 5\n')
    result = tapdeck("info", "--no-probe", "--json", "--dataset", str(dataset), tmp=tmp_path)
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)["datasets"][-1]  # after the shipped ones
    assert [t["name"] for t in listed["tasks"]] == ["fizzbuzz-python", "json-config", "sum-numbers"]
    assert result.stderr.splitlines() == [
        f"tapdeck info: warning: {dataset / 'greet-script' / 'task.toml'}: not TOML (Expected '=' "
        "after a key in a key/value pair (at line 1, column 6)); task left out",
        f"tapdeck info: warning: {dataset / 'hello-file' / 'task.toml'}: not a task config "
        "(task.name: Input should be a valid string); task left out",
    ]


def test_info_refuses_a_dataset_path_that_does_not_exist_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    result = tapdeck("info", "--no-probe", "--dataset", str(missing), tmp=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""  # refused before anything is listed
    assert one_line(result) == (
        f"tapdeck info: cannot load dataset {missing}: dataset folder {missing} does not exist"
    )


def test_info_refuses_a_dataset_name_its_registry_does_not_know(tmp_path: Path) -> None:
    with registry_knowing_no_dataset() as registry:
        result = tapdeck(
            "info",
            "--no-probe",
            "--dataset",
            "no-such-dataset",
            tmp=tmp_path,
            env={REGISTRY_URL_VAR: registry},
        )
    assert result.returncode == 2
    assert one_line(result) == (
        "tapdeck info: unknown dataset 'no-such-dataset': no folder of that "
        "name here, and the Harbor registry does not know it (Dataset "
        "no-such-dataset not found)"
    )


@pytest.mark.medium
def test_info_says_a_registry_that_does_not_answer_is_unreachable_and_exits_1(tmp_path: Path) -> None:
    result = tapdeck(
        "info",
        "--no-probe",
        "--dataset",
        "no-such-dataset",
        tmp=tmp_path,
        env={REGISTRY_URL_VAR: f"http://127.0.0.1:{free_port()}"},
    )
    assert result.returncode == 1
    assert "Dataset no-such-dataset (0 tasks)" in result.stdout  # the rest is listed
    assert one_line(result).startswith(
        "tapdeck info: dataset source unreachable: the Harbor registry did not answer (ConnectError: "
    )
