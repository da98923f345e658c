"""`tapdeck sessions`: the capture sessions of a data dir, headless, read from its store.

What the Sessions and Rollout screens show, for a shell without the TUI (a script, a pipe, an SSH
session with no room for a full screen): the sessions, one session's rollout graph with its
findings, one turn's sampled tokens with their logprobs. The store is opened read-only and no
server is started, so it answers while a server writes the same store.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tapdeck.app.commands.options import DataDirOption
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError

if TYPE_CHECKING:
    from tapdeck.proxy.capture.graph import RolloutGraph
    from tapdeck.proxy.store.database import Store
    from tapdeck.schema.sessions import SessionSummary, TurnDetail

WIDTH = 80
"""Columns every line is laid out for (the narrowest terminal tapdeck supports)."""
LIST_NEWEST = 20
"""Sessions the list shows unless --all or --run: each costs its graph's rebuild."""
TONE_STYLES = {"sure": "green", "mid": "", "low": "yellow", "vlow": "bold red", "masked": "dim"}
"""A sampled token's line on a terminal, by how likely the engine found it
(`views.tokens.logprob_tone`)."""


def register(app: typer.Typer) -> None:
    """Add the `sessions` command."""

    @app.command("sessions")
    def sessions(
        session_id: str | None = typer.Argument(
            None, metavar="SESSION", help="A session id (s-…): its rollout graph."
        ),
        turn: int | None = typer.Option(
            None,
            "--turn",
            min=0,
            help="With SESSION: this turn's sampled tokens, one a line "
            "with id, logprob and the alternatives captured.",
        ),
        run: str | None = typer.Option(None, "--run", help="List only this run's sessions."),
        show_all: bool = typer.Option(
            False, "--all", help=f"List every session (default: the {LIST_NEWEST} newest)."
        ),
        as_json: bool = typer.Option(
            False,
            "--json",
            help="As the server's admin API answers: "
            "GET /admin/sessions, /sessions/S/rollout or /sessions/S/turns/N.",
        ),
        data_dir: DataDirOption = None,
    ) -> None:
        """List the data dir's capture sessions, newest first, or show one session's rollout graph
        and findings, or one turn's tokens (exit 1: no such session or turn; 2: bad usage)."""
        from tapdeck.app.commands.stored_capture import stored_capture
        from tapdeck.runner.run_dir import is_run_id

        for given, what in ((session_id, "session"), (run, "run")):
            if given is not None and not is_run_id(given):
                raise CommandError(
                    EXIT_USAGE, f"tapdeck sessions: {given!r} is not a {what} id: give a plain id, not a path"
                )
        if turn is not None and session_id is None:
            raise CommandError(EXIT_USAGE, "tapdeck sessions: --turn needs a SESSION")
        if session_id is not None and (run is not None or show_all):
            raise CommandError(
                EXIT_USAGE,
                "tapdeck sessions: --run and --all choose what the list shows; give them without a SESSION",
            )
        with stored_capture(data_dir, "sessions") as (root, store):
            if session_id is None:
                _list(store, run=run, show_all=show_all, as_json=as_json, runs_dir=root / "runs")
                return
            try:
                record, graph = store.load_graph(session_id)
            except KeyError:
                raise CommandError(
                    EXIT_COULD_NOT_RUN,
                    f"tapdeck sessions: no session {session_id} "
                    f"in {store.path} (`tapdeck sessions` lists them; pass the "
                    "--data-dir it ran in)",
                ) from None
            if turn is None:
                _show_session(record, graph, as_json=as_json)
            else:
                _show_turn(record, graph, turn, as_json=as_json)


def stored_summary(record: dict[str, Any], graph: RolloutGraph) -> SessionSummary:
    """A stored session as the server summarises it (`GET /admin/sessions`), from its record and
    graph: the graph's stats, its state as stored and the FATAL/WARN findings it holds."""
    from tapdeck.proxy.capture.validation import reported_stats
    from tapdeck.schema.findings import Finding, Level
    from tapdeck.schema.sessions import EngineRef, SessionSummary

    findings = [*(Finding.model_validate(f) for f in record.get("findings") or []), *graph.findings()]
    rollout_type = record.get("rollout_type", "eval")
    stats = reported_stats(graph.stats(), record.get("tier", "text"), rollout_type)
    last_call = max((n.turn.created_at for n in graph.nodes.values()), default=None)
    return SessionSummary(
        **stats,
        id=record["id"],
        state=record.get("state", "closed"),
        tier=record.get("tier", "text"),
        rollout_type=rollout_type,
        created_at=record.get("created_at", 0.0),
        last_call_at=last_call,
        seconds_since_last_call=None if last_call is None else time.time() - last_call,
        metadata=record.get("metadata") or {},
        engine=EngineRef.model_validate(record.get("engine") or {"url": ""}),
        fatal=sum(f.level is Level.FATAL for f in findings),
        warn=sum(f.level is Level.WARN for f in findings),
    )


def _console() -> Any:
    from rich.console import Console

    return Console(width=min(WIDTH, Console().width), highlight=False)


def _list(store: Store, *, run: str | None, show_all: bool, as_json: bool, runs_dir: Path) -> None:
    """The sessions, newest first: all of --run's, else the newest LIST_NEWEST unless --all.

    A --run that names no run (no session of it, no folder in `runs_dir`) ends with exit 1: a
    mistyped id would otherwise read as a run that made no sessions."""
    from tapdeck.schema.sessions import SessionList

    records = store.list_sessions()[::-1]
    if run is not None:
        records = [r for r in records if (r.get("metadata") or {}).get("run_id") == run]
        if not records and not (runs_dir / run).is_dir():
            raise CommandError(
                EXIT_COULD_NOT_RUN,
                f"tapdeck sessions: no run {run} in {runs_dir} "
                "(`tapdeck runs` lists them; pass the --data-dir it ran in)",
            )
    left = 0 if run is not None or show_all else max(0, len(records) - LIST_NEWEST)
    records = records[: len(records) - left]
    summaries = [stored_summary(*store.load_graph(r["id"])) for r in records]
    if as_json:
        typer.echo(SessionList(sessions=summaries).model_dump_json(indent=2))
        return
    if not summaries:
        where = f" of run {run}" if run is not None else ""
        typer.echo(f"no capture sessions{where} in {store.path} (tapdeck rollout makes some)", err=True)
        return
    _print_list(summaries)
    if left:
        typer.echo(f"… and {left} older session(s): --all lists them, --run RUN one run's")


def _print_list(summaries: list[SessionSummary]) -> None:
    """One row per session in at most 80 columns: the whole id (to pass back), the state as the
    Sessions screen words it, task, graph counts, findings and reward."""
    from rich.table import Table

    from tapdeck.app.views.sessions import session_state
    from tapdeck.app.views.text import fmt_reward

    table = Table(box=None, pad_edge=False, expand=False, show_edge=False, padding=(0, 1, 0, 0))
    table.add_column("session", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("task", no_wrap=True, overflow="ellipsis", max_width=14)
    for name in ("turn", "root", "fork", "!"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("reward", justify="right", no_wrap=True)
    for s in summaries:
        marks = "F" * bool(s.fatal) + "W" * bool(s.warn) or "-"
        table.add_row(
            s.id,
            session_state(s),
            str(s.metadata.get("task") or "-"),
            str(s.turns),
            str(s.roots),
            str(s.forks),
            marks,
            str(s.trainable_tokens),
            fmt_reward(s.metadata.get("reward")),
        )
    _console().print(table)


def _show_session(record: dict[str, Any], graph: RolloutGraph, *, as_json: bool) -> None:
    """The session's header, its rollout graph as an indented tree (forks nest, chains stay
    flat, as on the Rollout screen) and every finding: wrapped on a terminal, one line each in a
    file."""
    from tapdeck.app.views.graph import display_parents, rollout_nodes, rollout_roots, turn_label
    from tapdeck.app.views.sessions import session_state
    from tapdeck.app.views.text import fmt_reward, phrase_lines
    from tapdeck.proxy.capture.export import graph_view, rollout_document
    from tapdeck.schema.findings import Finding
    from tapdeck.schema.sessions import GraphView, RolloutDocument

    tier = record.get("tier", "text")
    doc = RolloutDocument.model_validate(rollout_document(record, graph, tier))
    if as_json:
        typer.echo(doc.model_dump_json(indent=2))
        return
    summary = stored_summary(record, graph)
    session_findings = [Finding.model_validate(f) for f in record.get("findings") or []]
    view = GraphView.model_validate(graph_view(record, graph, tier, since=0, findings=session_findings))
    meta, st = doc.metadata, doc.stats
    engine = record.get("engine") or {}
    head = [
        f"session {doc.session_id}",
        session_state(summary),
        f"{tier} tier",
        f"{doc.rollout_type} rollout",
        "ok" if doc.ok else "not ok",
    ]
    head += [f"{key} {meta[key]}" for key in ("task", "harness", "rollout_id") if meta.get(key)]
    head.append("reward " + (fmt_reward(doc.reward) if doc.reward is not None else "– (never graded)"))
    if engine.get("url"):
        head.append(f"engine {engine.get('model') or '?'} at {engine['url']}")
    head += [
        f"{st.turns} turn(s)",
        f"{st.roots} root(s)",
        f"{st.forks} fork(s)",
        f"{st.breaks} break(s)",
        f"{st.discarded} discarded",
        f"{st.trainable_tokens} trainable tokens",
        f"fragmentation {st.fragmentation:.2f}",
    ]
    console = _console()
    say = console.print
    for line in phrase_lines(head, WIDTH):
        say(line, markup=False)
    nodes = rollout_nodes(view.turns)
    if not nodes:
        say("no model calls captured", markup=False)
    else:
        say("")
        prompts = {t.seq: t.prompt_len for t in view.turns}
        shown = display_parents(nodes)
        listed: dict[int | None, list[int]] = {}
        for seq in sorted(nodes):
            listed.setdefault(shown[seq], []).append(seq)

        def tree(seq: int, depth: int) -> None:
            indent = "  " * depth
            prompt = prompts.get(seq)
            tail = f"prompt {prompt}" if prompt is not None else "no prompt ids"
            label = turn_label(nodes[seq], WIDTH - len(indent) - len(tail) - 1)
            say(f"{indent}{label}".ljust(WIDTH - len(tail)) + tail, markup=False)
            for child in listed.get(seq, []):
                tree(child, depth + 1)

        for root in rollout_roots(nodes):
            tree(root, 0)
    findings = [*doc.findings, *session_findings]
    if findings:
        say("")
        for f in findings:
            where = f" (turn {f.turn})" if f.turn is not None else ""
            say(f"{f}{where}", markup=False, soft_wrap=not console.is_terminal)
    if nodes:
        say(f"a turn's tokens: tapdeck sessions {doc.session_id} --turn N", markup=False)


def _show_turn(record: dict[str, Any], graph: RolloutGraph, seq: int, *, as_json: bool) -> None:
    """One turn: its link, lengths and findings, then each sampled token on a line of its own
    (index, id, logprob, probability, text, the top alternatives captured), coloured by logprob
    on a terminal as the Rollout screen colours it."""
    from tapdeck.app.views.graph import capture_mode_text
    from tapdeck.app.views.text import phrase_lines
    from tapdeck.app.views.tokens import logprob_tone
    from tapdeck.proxy.capture.export import turn_detail
    from tapdeck.schema.sessions import TurnDetail

    if seq not in graph.nodes:
        last = f"it has turns 0-{max(graph.nodes)}" if graph.nodes else "it has no turns"
        raise CommandError(
            EXIT_COULD_NOT_RUN, f"tapdeck sessions: session {record['id']} has no turn {seq} ({last})"
        )
    detail = TurnDetail.model_validate(turn_detail(graph, seq))
    if as_json:
        typer.echo(json.dumps(detail.model_dump(mode="json"), indent=2))
        return
    console = _console()
    for line in phrase_lines(_turn_head(record["id"], detail, capture_mode_text(detail.meta)), WIDTH):
        console.print(line, markup=False)
    for f in detail.findings:
        console.print(str(f), markup=False, soft_wrap=not console.is_terminal)
    ids = detail.sampled_ids or []
    if not ids:
        console.print("no sampled token ids captured (text tier, or the engine returned none)", markup=False)
        return
    lps, mask, tops = detail.logprobs or [], detail.mask or [], detail.top_logprobs or []
    texts = detail.token_texts or []
    if not any(tops):
        console.print("no alternatives captured (rollout --alternatives N asks for them)", markup=False)
    console.print(f"{'#':>5} {'id':>7} {'logprob':>8} {'p':>5}  token", markup=False)
    for index, token_id in enumerate(ids):
        lp = lps[index] if index < len(lps) else None
        tone = logprob_tone(lp, masked=index < len(mask) and not mask[index])
        text = repr(texts[index]) if index < len(texts) else "?"
        odds = "       –     –" if lp is None else f"{lp:8.3f} {math.exp(lp):5.3f}"
        alts = tops[index] if index < len(tops) else None
        line = f"{index:>5} {token_id:>7} {odds}  {text}"
        if alts:
            line += "  top " + ", ".join(f"{alt!r} {alt_lp:.2f}" for alt, alt_lp in alts[:3])
        console.print(line, markup=False, soft_wrap=True, style=TONE_STYLES[tone] or None)


def _turn_head(session_id: str, detail: TurnDetail, mode: str) -> list[str]:
    """The phrases of a turn's header line."""
    link = "a root" if detail.parent is None else f"{detail.link_kind} link to #{detail.parent}"
    head = [
        f"session {session_id} turn #{detail.seq}",
        link,
        "no prompt ids" if detail.prompt_len is None else f"prompt {detail.prompt_len} tokens",
        f"{len(detail.sampled_ids or [])} sampled",
        f"finish {detail.finish_reason or '–'}",
    ]
    if detail.mask and not any(detail.mask):
        head.append("masked (not trained on)")
    if mode:
        head.append(mode)
    return head
