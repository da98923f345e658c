"""`tapdeck export SESSION|RUN`: training data files straight from the capture store (no server).

One row per trainable-capable agent turn (its own prompt ids, completion ids, logprobs, loss mask,
request, response), each with its session, rollout, group id and reward — for a run, every rollout
of `<data_dir>/runs/<id>/results.jsonl` that ended ok, the reward taken from there (`null` = never
graded, never 0) and its outcome (`ok`, `error_kind`). Eval rollouts give no rows (they may not be
trained on), nor do rollouts that did not end ok unless asked; the counts of both are printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from tapdeck.app.commands.options import DataDirOption
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError


def session_rows(store: Any, session_id: str, **given: Any) -> list[dict[str, Any]]:
    """The training rows of one stored session (empty for an eval rollout); `given` are
    `proxy.export.trace_rows`'s keywords (a run's group, rollout id and its result's reward, which
    replaces the session's annotated one, None included). The session's latest replay, if any,
    gives the `reference` and `ref_logprobs` columns."""
    from tapdeck.proxy.capture.export import trace_rows

    record, graph = store.load_graph(session_id)
    reference = store.latest_reference(session_id)
    return trace_rows(record, graph, record.get("tier", "text"), reference=reference, **given)


class ExportFailed(Exception):
    """The export cannot be written; the message says why in one line."""


def run_rows(
    store: Any, run_dir: Path, *, include_failed: bool = False
) -> tuple[list[dict[str, Any]], int, int]:
    """Rows of a run's rollouts that have a capture session; how many rollouts gave none; how many
    were left out for not ending ok.

    Every row carries its rollout's `ok` and `error_kind`. A rollout that did not end ok
    (failed, cancelled) is left out unless `include_failed`: a trainer reading the file would
    otherwise learn from a rollout nobody graded. ExportFailed when no result can be read;
    RunSessionsMissing when a rollout to export names a session the store does not have.
    """
    from tapdeck.proxy.capture.export import check_run_sessions
    from tapdeck.runner.run_dir import RESULTS, load_results

    path = run_dir / RESULTS
    results = load_results(path)
    if not results:
        lines = (
            sum(1 for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip())
            if path.is_file()
            else 0
        )
        what = (
            "it is a directory, not a file"
            if path.is_dir()
            else f"{lines} line(s), none a rollout result: the file is corrupt"
            if lines
            else "it is empty or missing: no rollout of the run has finished"
        )
        raise ExportFailed(f"no rollout results can be read from {path} ({what})")
    wanted = [r for r in results.values() if r.ok or include_failed]
    failed = len(results) - len(wanted)
    check_run_sessions(store, run_dir.name, wanted)
    rows: list[dict[str, Any]] = []
    empty = 0
    for result in wanted:
        if not result.session_id:
            empty += 1
            continue
        got = session_rows(
            store,
            result.session_id,
            group_id=str(result.group),
            rollout_id=result.rollout_id,
            reward=result.reward,
        )
        for row in got:
            row["run_id"] = result.run_id or run_dir.name
            row["task"] = result.task
            row["ok"] = result.ok
            row["error_kind"] = result.error_kind
        rows.extend(got)
        empty += not got
    return rows, empty, failed


FORMAT_SUFFIXES = {".jsonl": "jsonl", ".parquet": "parquet"}
"""What an --out file's suffix says its format is."""


def output_format(fmt: str | None, out: str | None) -> str:
    """The format to write: --format, else the one --out's suffix names, else jsonl; both matched
    case-insensitively (`--format JSONL` as `--out X.JSONL`). ValueError when they disagree or
    --out names a directory (an existing one, or a path ending in /)."""
    chosen = fmt.lower() if fmt is not None else None
    if chosen is not None and chosen not in FORMAT_SUFFIXES.values():
        raise ValueError(f"--format must be jsonl or parquet, not {fmt!r}")
    if out is None:
        return chosen or "jsonl"
    if out.endswith("/") or Path(out).is_dir():
        raise ValueError(f"--out {out} names a directory; give a file path, e.g. {Path(out) / 'rows.jsonl'}")
    implied = FORMAT_SUFFIXES.get(Path(out).suffix.lower())
    if chosen is not None and implied is not None and implied != chosen:
        raise ValueError(f"--out {out} names a {implied} file but --format is {chosen}; change one of them")
    return chosen or implied or "jsonl"


def register(app: typer.Typer) -> None:
    """Add the `export` command."""

    @app.command("export")
    def export(
        target: str = typer.Argument(..., help="A session id (s-…) or a run id."),
        fmt: str | None = typer.Option(
            None, "--format", help="jsonl or parquet (default: --out's suffix, else jsonl)."
        ),
        out: str | None = typer.Option(
            None, "--out", help="Output file (default <data-dir>/exports/<id>.<format>)."
        ),
        include_failed: bool = typer.Option(
            False,
            "--include-failed",
            help="Also export rollouts that did not end ok (rows marked ok: false); left out by default.",
        ),
        data_dir: DataDirOption = None,
    ) -> None:
        """Write a session's or a run's captured rollouts as JSONL or Parquet."""
        from tapdeck.app.commands.runner_warnings import runner_warnings_on_stderr
        from tapdeck.app.commands.stored_capture import stored_capture
        from tapdeck.proxy.capture.export import RunSessionsMissing, write_jsonl, write_parquet
        from tapdeck.runner.run_dir import is_run_id

        try:
            fmt = output_format(fmt, out)
        except ValueError as exc:
            raise CommandError(EXIT_USAGE, f"tapdeck export: {exc}") from None
        if not is_run_id(target):  # else `.`, `..` or a path would name another folder as the run
            raise CommandError(
                EXIT_USAGE,
                f"tapdeck export: {target!r} is not a session or run "
                "id: give a plain id (s-… or run-…), not a path",
            )
        failed = 0
        with stored_capture(data_dir, "export") as (root, store):  # never changes the store
            run_dir = root / "runs" / target
            try:
                if run_dir.is_dir():
                    with runner_warnings_on_stderr("export"):  # a result line skipped: said once
                        rows, empty, failed = run_rows(store, run_dir, include_failed=include_failed)
                elif target in {s["id"] for s in store.list_sessions()}:
                    rows = session_rows(store, target)
                    empty = int(not rows)
                else:
                    raise ExportFailed(
                        f"{target!r} is neither a session in {store.path} nor a run in {root / 'runs'}"
                    )
            except (ExportFailed, RunSessionsMissing) as exc:
                raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck export: {exc}") from None
        path = Path(out) if out else root / "exports" / f"{target}.{fmt}"
        (write_jsonl if fmt == "jsonl" else write_parquet)(path, rows)
        notes = [f"{empty} rollout(s) without training rows: eval tier or no calls"] if empty else []
        if failed:
            notes.append(
                f"{failed} rollout(s) left out for not ending ok; --include-failed "
                "exports them marked ok: false"
            )
        note = f" ({'; '.join(notes)})" if notes else ""
        typer.echo(f"wrote {len(rows)} turn row(s) to {path}{note}")
