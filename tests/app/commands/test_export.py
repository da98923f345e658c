"""`tapdeck export` files, and the server's run export that answers as the command does."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tapdeck.proxy.http.server import create_app
from tapdeck.proxy.service import CaptureService
from tapdeck.proxy.store.database import Store

CHAT = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def _open(admin: httpx.Client, **spec) -> dict:
    resp = admin.post("/admin/sessions", json=spec)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _two_captured_sessions(upstream, make_server, admin_for) -> tuple[Path, list[dict]]:
    """A server's data dir holding two sessions, each with one captured chat call."""
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    infos = [_open(admin) for _ in range(2)]
    for info in infos:
        httpx.post(
            f"{server.url}/v1/chat/completions",
            json=CHAT,
            headers={"Authorization": f"Bearer {info['api_key']}"},
        ).raise_for_status()
    return server.config.data_dir, infos


def test_export_session_and_run_files(upstream, make_server, admin_for, tmp_path: Path):
    from tapdeck.app.cli import app

    data, infos = _two_captured_sessions(upstream, make_server, admin_for)
    run = data / "runs" / "run-1"
    run.mkdir(parents=True)
    results = [
        {
            "rollout_id": "r0",
            "run_id": "run-1",
            "task": "t",
            "group": 0,
            "index": 0,
            "session_id": infos[0]["id"],
            "reward": 1.0,
            "ok": True,
        },
        {
            "rollout_id": "r1",
            "run_id": "run-1",
            "task": "t",
            "group": 0,
            "index": 1,
            "session_id": infos[1]["id"],
            "reward": None,
            "ok": True,
        },
    ]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))

    runner = CliRunner()
    out = tmp_path / "s.jsonl"
    res = runner.invoke(
        app, ["export", infos[0]["id"], "--format", "jsonl", "--out", str(out), "--data-dir", str(data)]
    )
    assert res.exit_code == 0, res.output
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["session_id"] == infos[0]["id"] and len(row["prompt_token_ids"]) == 37
    assert row["loss_mask"][-1] == 1 and row["reward"] is None

    out = tmp_path / "run.parquet"
    res = runner.invoke(
        app, ["export", "run-1", "--format", "parquet", "--out", str(out), "--data-dir", str(data)]
    )
    assert res.exit_code == 0, res.output
    table = pq.read_table(out).to_pylist()
    assert [r["reward"] for r in table] == [1.0, None]
    assert {r["group_id"] for r in table} == {"0"} and {r["run_id"] for r in table} == {"run-1"}

    res = runner.invoke(app, ["export", "nope", "--data-dir", str(data)])
    assert res.exit_code == 1 and "neither a session" in res.output


@pytest.mark.medium
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_export_that_fails_half_way_leaves_the_previous_file_whole_and_no_temporary_one(
    upstream, make_server, admin_for, tmp_path: Path, fmt: str
):
    """`--out FILE` was rewritten in place: a failure half-way (here the disk refusing a file that
    large, as a full disk or a quota does) left a truncated FILE where a good export had been."""
    import resource
    import subprocess

    from tests.support.tapdeck_process import TAPDECK

    data, infos = _two_captured_sessions(upstream, make_server, admin_for)
    run = data / "runs" / "run-1"
    run.mkdir(parents=True)
    (run / "results.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "rollout_id": f"r{i}",
                    "task": "t",
                    "group": 0,
                    "index": i,
                    "session_id": info["id"],
                    "reward": 1.0,
                    "ok": True,
                }
            )
            + "\n"
            for i, info in enumerate(infos)
        )
    )
    out = tmp_path / "exports" / f"rows.{fmt}"
    argv = [str(TAPDECK), "export", "run-1", "--out", str(out), "--data-dir", str(data)]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    good = out.read_bytes()
    (run / "results.jsonl").write_text(
        (run / "results.jsonl").read_text().replace('"reward": 1.0', '"reward": 0.5')
    )

    def small_files() -> None:  # no file the export writes may grow past half the good one
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(good) // 2, len(good) // 2))

    second = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, check=False, preexec_fn=small_files
    )
    assert second.returncode == 1, second.stderr
    assert second.stderr.strip() == f"tapdeck export: cannot use {out}: File too large"
    assert out.read_bytes() == good
    assert [p.name for p in out.parent.iterdir()] == [out.name]


def _data_with_run(tmp_path: Path, results_text: str) -> Path:
    """A data dir with an empty capture store and run `r1` whose results.jsonl is `results_text`."""
    data = tmp_path / "data"
    (data / "runs" / "r1").mkdir(parents=True)
    Store(data / "capture.db").close()
    (data / "runs" / "r1" / "results.jsonl").write_text(results_text)
    return data


def _run_export_client(data: Path, k: int) -> httpx.AsyncClient:
    """An admin client (key `k`) of a server on `data` whose run `r1` has a plan of `k` rollouts."""
    from tapdeck.runner.api import create_runner_router
    from tapdeck.runner.batch import RunPlan

    (data / "runs" / "r1" / "plan.json").write_text(
        json.dumps(
            {
                "plan": RunPlan(k=k).model_dump(mode="json"),
                "tasks": [{"name": "t", "path": "t"}],
                "created_at": 0.0,
            }
        )
    )
    service = CaptureService(Store(data / "capture.db"), default_engine=None, public_url="http://127.0.0.1:9")
    server = create_app(
        service, admin_key="k", routers=[create_runner_router(service, data_dir=data, default_engine=None)]
    )
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=server),
        base_url="http://server",
        headers={"Authorization": "Bearer k"},
    )


def test_export_leaves_out_rollouts_that_did_not_end_ok_unless_asked(
    upstream, make_server, admin_for, tmp_path: Path
):
    from tapdeck.app.cli import app

    data, infos = _two_captured_sessions(upstream, make_server, admin_for)
    run = data / "runs" / "run-2"
    run.mkdir(parents=True)
    results = [
        {
            "rollout_id": "ok",
            "task": "t",
            "group": 0,
            "index": 0,
            "session_id": infos[0]["id"],
            "reward": 0.0,
            "ok": True,
        },
        {
            "rollout_id": "cancelled",
            "task": "t",
            "group": 0,
            "index": 1,
            "session_id": infos[1]["id"],
            "reward": None,
            "ok": False,
            "error_kind": "cancelled",
        },
    ]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    out = tmp_path / "rows.jsonl"

    res = CliRunner().invoke(app, ["export", "run-2", "--out", str(out), "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["rollout_id"], r["ok"], r["error_kind"]) for r in rows] == [("ok", True, None)]
    assert "1 rollout(s) left out for not ending ok; --include-failed" in res.output

    res = CliRunner().invoke(
        app, ["export", "run-2", "--out", str(out), "--data-dir", str(data), "--include-failed"]
    )
    assert res.exit_code == 0, res.output
    rows = {r["rollout_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["cancelled"]["ok"] is False and rows["cancelled"]["error_kind"] == "cancelled"
    assert rows["cancelled"]["reward"] is None and rows["ok"]["ok"] is True


@pytest.mark.parametrize(
    ("results", "why"),
    [
        ("{not json\n", "(1 line(s), none a rollout result: the file is corrupt)"),
        ("", "(it is empty or missing: no rollout of the run has finished)"),
    ],
)
def test_export_of_a_run_whose_results_cannot_be_read_says_why(results: str, why: str, tmp_path: Path):
    from tapdeck.app.cli import app

    data = _data_with_run(tmp_path, results)
    res = CliRunner().invoke(app, ["export", "r1", "--data-dir", str(data)])
    assert res.exit_code == 1
    assert f"no rollout results can be read from {data / 'runs' / 'r1' / 'results.jsonl'} {why}" in res.output
    assert not (data / "exports").exists()


def test_export_of_a_run_whose_results_file_is_a_directory_says_so(tmp_path: Path):
    from tapdeck.app.cli import app

    data = _data_with_run(tmp_path, "")
    results = data / "runs" / "r1" / "results.jsonl"
    results.unlink()
    results.mkdir()
    res = CliRunner().invoke(app, ["export", "r1", "--data-dir", str(data)])
    assert res.exit_code == 1
    assert res.output.strip() == (
        f"tapdeck export: no rollout results can be read from {results} (it is a directory, not a file)"
    )


def test_export_refuses_a_run_whose_sessions_are_not_in_the_store(tmp_path: Path):
    # The run's folder was copied into another data dir: a partial export would pass for the run.
    from tapdeck.app.cli import app

    data = _data_with_run(
        tmp_path,
        "".join(
            json.dumps(
                {
                    "rollout_id": f"r1.g0r{i}",
                    "task": "t",
                    "group": 0,
                    "index": i,
                    "ok": True,
                    "session_id": f"s-gone{i}",
                }
            )
            + "\n"
            for i in range(2)
        ),
    )
    res = CliRunner().invoke(app, ["export", "r1", "--data-dir", str(data)])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)  # handled, not raised
    assert res.output.strip() == (
        f"tapdeck export: run r1's rollout r1.g0r0 names session s-gone0, which is not in "
        f"{data / 'capture.db'} (and 1 more rollout(s) name sessions it does not have): export "
        "from the data dir the run was made in"
    )
    assert not (data / "exports").exists()


async def test_the_servers_run_export_refuses_a_run_with_sessions_missing_as_the_cli_does(tmp_path: Path):
    from tapdeck.app.cli import app as cli
    from tapdeck.runner.run_dir import rollout_id

    data = _data_with_run(
        tmp_path,
        "".join(
            json.dumps(
                {
                    "rollout_id": rollout_id("r1", 0, i),
                    "task": "t",
                    "group": 0,
                    "index": i,
                    "ok": True,
                    "session_id": f"s-gone{i}",
                }
            )
            + "\n"
            for i in range(2)
        ),
    )
    async with _run_export_client(data, k=2) as client:
        resp = await client.post("/admin/runs/r1/export", json={"format": "jsonl"})
    said = CliRunner().invoke(cli, ["export", "r1", "--data-dir", str(data)]).output.strip()
    assert resp.status_code == 409
    assert (
        resp.json()["detail"]
        == said.removeprefix("tapdeck export: ")
        == (
            f"run r1's rollout {rollout_id('r1', 0, 0)} names session s-gone0, which is not in "
            f"{data / 'capture.db'} (and 1 more rollout(s) name sessions it does not have): export "
            "from the data dir the run was made in"
        )
    )
    assert not (data / "runs" / "r1" / "export.jsonl").exists()


@pytest.mark.parametrize("target", ["", ".", "..", "runs/r1", "../data"])
def test_export_refuses_a_target_that_is_not_a_plain_id(target: str, tmp_path: Path):
    # Taken as a run id, each would name another folder (runs/, the data dir, ...) as the run.
    from tapdeck.app.cli import app

    data = _data_with_run(tmp_path, "")
    res = CliRunner().invoke(app, ["export", target, "--data-dir", str(data)])
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"tapdeck export: {target!r} is not a session or run id: give a plain id (s-… or run-…), not a path"
    )


def test_export_from_a_corrupt_capture_db_says_so(tmp_path: Path):
    from tapdeck.app.cli import app

    (tmp_path / "capture.db").write_text("garbage garbage garbage\n")
    res = CliRunner().invoke(app, ["export", "r1", "--data-dir", str(tmp_path)])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)  # handled, not raised
    assert f"capture.db at {tmp_path / 'capture.db'} is not a tapdeck store or is corrupt" in res.output


@pytest.mark.parametrize("target", ["r1", "s-abc"])
def test_export_refuses_a_database_that_is_not_a_store_and_leaves_it_byte_for_byte(
    target: str, tmp_path: Path
):
    # Another program's SQLite file where capture.db should be: read-write, the export used to
    # add tapdeck's tables to it (and switch it to WAL).
    import hashlib
    import sqlite3

    from tapdeck.app.cli import app

    db = tmp_path / "capture.db"
    with contextlib.closing(sqlite3.connect(db)) as foreign:
        foreign.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        foreign.execute("INSERT INTO invoices (total) VALUES (12.5)")
        foreign.commit()
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    res = CliRunner().invoke(app, ["export", target, "--data-dir", str(tmp_path)])
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture.db", "runs"]  # no -wal, -shm
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)  # handled, not raised
    assert res.output.strip() == (
        f"tapdeck export: {db} is an SQLite database but not a tapdeck "
        "capture store: it has no 'sessions' table"
    )


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--out", "{tmp}/"], "--out {tmp}/ names a directory"),
        (["--out", "{tmp}/new/"], "--out {tmp}/new/ names a directory"),
        (
            ["--out", "{tmp}/r1.jsonl", "--format", "parquet"],
            "--out {tmp}/r1.jsonl names a jsonl file but --format is parquet",
        ),
        (["--format", "csv"], "--format must be jsonl or parquet, not 'csv'"),
    ],
)
def test_export_refuses_an_out_path_its_format_cannot_go_to(args: list[str], why: str, tmp_path: Path):
    from tapdeck.app.cli import app

    data = _data_with_run(
        tmp_path, json.dumps({"rollout_id": "a", "task": "t", "group": 0, "index": 0, "ok": True}) + "\n"
    )
    res = CliRunner().invoke(
        app, ["export", "r1", "--data-dir", str(data), *(a.format(tmp=tmp_path) for a in args)]
    )
    assert res.exit_code == 2
    assert why.format(tmp=tmp_path) in res.output
    assert not (tmp_path / "new").exists() and not (tmp_path / "r1.jsonl").exists()


def test_export_writes_the_format_its_out_suffix_names(upstream, make_server, admin_for, tmp_path: Path):
    from tapdeck.app.cli import app

    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    httpx.post(
        f"{server.url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {info['api_key']}"}
    ).raise_for_status()
    out = tmp_path / "rows.parquet"
    res = CliRunner().invoke(
        app, ["export", info["id"], "--out", str(out), "--data-dir", str(server.config.data_dir)]
    )
    assert res.exit_code == 0, res.output
    assert [r["session_id"] for r in pq.read_table(out).to_pylist()] == [info["id"]]


@pytest.mark.parametrize(
    ("args", "written", "fmt"),
    [
        (["--format", "JSONL"], "{data}/exports/r1.jsonl", "jsonl"),
        (["--format", "Parquet"], "{data}/exports/r1.parquet", "parquet"),
        (["--out", "{tmp}/rows.PARQUET"], "{tmp}/rows.PARQUET", "parquet"),
        (["--format", "PARQUET", "--out", "{tmp}/rows.parquet"], "{tmp}/rows.parquet", "parquet"),
        (["--format", "jsonl", "--out", "{tmp}/rows.JSONL"], "{tmp}/rows.JSONL", "jsonl"),
    ],
)
def test_export_matches_format_and_out_suffix_case_insensitively_alike(
    args: list[str], written: str, fmt: str, tmp_path: Path
):
    # `--out X.PARQUET` was taken as parquet while `--format JSONL` was refused.
    from tapdeck.app.cli import app

    data = _data_with_run(
        tmp_path, json.dumps({"rollout_id": "a", "task": "t", "group": 0, "index": 0, "ok": True}) + "\n"
    )
    res = CliRunner().invoke(
        app, ["export", "r1", "--data-dir", str(data), *(a.format(tmp=tmp_path) for a in args)]
    )
    assert res.exit_code == 0, res.output
    path = Path(written.format(data=data, tmp=tmp_path))
    assert f"wrote 0 turn row(s) to {path} " in res.output
    assert path.read_bytes()[:4] == (b"PAR1" if fmt == "parquet" else b"")
    res = CliRunner().invoke(
        app,
        [
            "export",
            "r1",
            "--data-dir",
            str(data),
            "--format",
            "JSONL",
            "--out",
            str(tmp_path / "rows.Parquet"),
        ],
    )
    assert res.exit_code == 2
    assert f"--out {tmp_path / 'rows.Parquet'} names a parquet file but --format is jsonl" in res.output


def test_export_says_an_unreadable_results_line_once_as_its_own_warning(tmp_path: Path):
    # A real process: there Python printed the runner's log record bare on stderr (pytest's log
    # capture hides that in-process), where `tapdeck runs` says `tapdeck runs: warning: …`.
    import subprocess
    import sys

    data = _data_with_run(
        tmp_path,
        '{"not": "a result"}\n'
        + json.dumps({"rollout_id": "a", "task": "t", "group": 0, "index": 0, "ok": True})
        + "\n",
    )
    results = data / "runs" / "r1" / "results.jsonl"
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tapdeck.app.cli import main; main()",
            "export",
            "r1",
            "--data-dir",
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        f"tapdeck export: warning: {results}:1: not a rollout result (rollout_id: Field required), skipped"
    ]
    assert res.stdout.startswith(f"wrote 0 turn row(s) to {data / 'exports' / 'r1.jsonl'}")


@pytest.mark.parametrize("given", ["JSONL", "Parquet"])
async def test_the_servers_run_export_takes_its_format_in_any_case_as_the_cli_does(
    given: str, tmp_path: Path
):
    async with _run_export_client(_data_with_run(tmp_path, ""), k=1) as client:
        resp = await client.post("/admin/runs/r1/export", json={"format": given})
        refused = await client.post("/admin/runs/r1/export", json={"format": "csv"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["path"].endswith(f"export.{given.lower()}")
    assert refused.status_code == 422
