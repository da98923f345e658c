"""Export: the rollout document, the per-call training trace, and run files (JSONL / Parquet).

`reward: null` means the rollout was never graded; the proxy never sets a reward itself (it only
copies `reward` from the session metadata the runner annotated).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson

from tapdeck.proxy.capture.graph import RolloutGraph, Sequence
from tapdeck.proxy.capture.policy_stamp import policy_span
from tapdeck.proxy.capture.routing import routing_text
from tapdeck.proxy.capture.turn import Turn
from tapdeck.proxy.capture.validation import is_train, reported_stats, rollout_ok, validate_rollout
from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.store.atomic_write import atomic_write
from tapdeck.schema.findings import Finding

SCHEMA_VERSION = 1


class ExportRefused(ProxyError):
    """The rollout cannot be exported as training data (eval tier or eval rollout): 409."""

    def __init__(self, message: str) -> None:
        super().__init__(409, message, kind="export_refused")


class ExportError(ProxyError):
    """The graph produced inconsistent training data (a bug, never silently exported): 500, and
    retrying cannot help."""

    def __init__(self, message: str) -> None:
        super().__init__(500, message, kind="export_inconsistent", retryable=False)


class RunSessionsMissing(ProxyError):
    """A run's rollout names a capture session the store does not have: 409, as for any other run
    whose files do not agree."""

    def __init__(self, message: str) -> None:
        super().__init__(409, message, retryable=False)


def check_run_sessions(store: Any, run_id: str, results: Iterable[Any]) -> None:
    """RunSessionsMissing when a result (`rollout_id`, `session_id`) names a session `store` does
    not have, as when the run's folder was copied into another data dir: the run is refused rather
    than its rollouts skipped, since a partial export would pass for the whole run. One check for
    `tapdeck export` and the server's run export, so both refuse the same runs the same way."""
    known = {s["id"] for s in store.list_sessions()}
    missing = [r for r in results if r.session_id and r.session_id not in known]
    if not missing:
        return
    more = (
        f" (and {len(missing) - 1} more rollout(s) name sessions it does not have)"
        if len(missing) > 1
        else ""
    )
    raise RunSessionsMissing(
        f"run {run_id}'s rollout {missing[0].rollout_id} names session "
        f"{missing[0].session_id}, which is not in {store.path}{more}: "
        "export from the data dir the run was made in"
    )


def _rollout_type(session: dict[str, Any], tier: str) -> str:
    declared = str(session.get("rollout_type") or "auto")
    if declared == "auto":
        return "train" if str(tier) == "tokens" else "eval"
    return declared


def _reward(session: dict[str, Any]) -> float | None:
    meta = session.get("metadata") or {}
    value = meta.get("reward", session.get("reward"))
    return None if value is None else float(value)


def _out(arr: np.ndarray | None, lists: bool) -> Any:
    if arr is None:
        return None
    return arr.tolist() if lists else arr


def _trace_logps(logprobs: np.ndarray | None, n: int, lists: bool) -> tuple[Any, int]:
    """A turn's logprobs as a trainer's strict schema takes them: n finite values, none positive.

    A value the engine did not give (or gave as NaN) becomes 0.0, and such a turn is never trained
    (the graph masks it). A positive one becomes 0.0 too: within the graph's float slack the turn
    stays trained (the difference is rounding), beyond it the turn is masked. The number of values
    replaced is returned so it is recorded in the entry's metadata, not hidden.
    """
    arr = None if logprobs is None else np.asarray(logprobs, dtype=np.float64)
    if arr is None or arr.shape != (n,):
        return _out(np.zeros(n), lists), n
    bad = ~np.isfinite(arr) | (arr > 0)
    return _out(np.where(bad, 0.0, arr), lists), int(bad.sum())


def nest_tool_calls(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message with tool calls as `{id, type: "function", function: {name, arguments}}`."""
    calls = message.get("tool_calls")
    if not calls:
        return dict(message)
    nested = []
    for i, tc in enumerate(calls):
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = orjson.dumps(args if args is not None else {}).decode()
        nested.append(
            {
                "id": tc.get("id") or f"call_{i}",
                "type": "function",
                "function": {"name": fn.get("name") or "", "arguments": args},
            }
        )
    return dict(message) | {"tool_calls": nested}


def capture_mode(meta: dict[str, Any] | None) -> Literal["ids", "text"]:
    """`ids` for a call continued from stored ids (token-in), else `text`."""
    mode = ((meta or {}).get("capture_mode") or {}).get("mode")
    return "ids" if mode == "ids" else "text"


def _check_masks(sequences: list[Any]) -> None:
    """A call shared by several sequences must carry the same mask in each (capture-case 56)."""
    seen: dict[int, int] = {}
    for s in sequences:
        if s.loss_mask is None:
            continue
        for seq, start, end in s.spans:
            span = s.loss_mask[start:end]
            value = int(span[0]) if span.size else 0
            if span.size and (span != value).any():
                raise ExportError(f"turn {seq}: mixed loss mask inside its sampled span")
            if seen.setdefault(seq, value) != value:
                raise ExportError(f"turn {seq}: loss mask {value} in one sequence, {seen[seq]} in another")


def _sequence_routing(graph: RolloutGraph, s: Sequence) -> str | None:
    """A sequence's MoE routing: its last call's, which covers every input id but the last
    (`proxy/capture/routing.py`); None when that call has none or covers other ids."""
    routed = graph.nodes[s.nodes[-1]].turn.routed_experts
    if routed is None or s.input_ids is None or routed.shape[0] != s.input_ids.size - 1:
        return None
    return routing_text(routed)


def rollout_document(
    session: dict[str, Any], graph: RolloutGraph, tier: str, *, lists: bool = True
) -> dict[str, Any]:
    """The whole rollout: turns, stats, sequences (input_ids, loss_mask, logprobs, role), findings.

    Eval rollouts get all-zero loss masks (no trainable rows). `lists=False` keeps numpy arrays
    (for orjson with OPT_SERIALIZE_NUMPY), which is much faster for long rollouts.
    """
    rtype = _rollout_type(session, tier)
    train = is_train(tier, rtype)
    tools = graph.has_tools()
    rollout_findings = validate_rollout(
        graph, tier, rollout_type=rtype, min_loss_mask_fraction=session.get("min_loss_mask_fraction")
    )
    sequences = graph.sequences()
    _check_masks(sequences)
    seq_docs = []
    for s in sequences:
        mask, lps = s.loss_mask, s.logprobs
        if not train and mask is not None:
            mask, lps = np.zeros_like(mask), np.zeros_like(lps)
        seq_docs.append(
            {
                "nodes": s.nodes,
                "role": s.role,
                "input_ids": _out(s.input_ids, lists),
                "loss_mask": _out(mask, lists),
                "logprobs": _out(lps, lists),
                "routed_experts": _sequence_routing(graph, s),
                "spans": [{"seq": a, "start": b, "end": c} for a, b, c in s.spans],
                "findings": [f.model_dump(mode="json") for f in rollout_findings if f.turn == s.nodes[-1]],
            }
        )
    turns = []
    for seq in sorted(graph.nodes):
        n = graph.nodes[seq]
        t = n.turn
        turns.append(
            {
                "seq": seq,
                "parent": n.parent,
                "link_kind": n.kind,
                "link_offset": n.offset,
                "capture_mode": capture_mode(t.meta),
                "role": graph.node_role(seq, tools=tools),
                "discarded": graph.discarded(seq),
                "trainable": train and graph.node_mask_on(seq, tools=tools),
                "prompt_len": n.prompt_len if n.has_prompt else None,
                "sampled_len": n.sampled_len if n.sampled is not None else None,
                "finish_reason": t.finish_reason,
                "request": t.request,
                "response": nest_tool_calls(t.response or {}),
                "sampling": t.sampling,
                "meta": t.meta,
                "created_at": t.created_at,
                "findings": [f.model_dump(mode="json") for f in t.findings + n.link_findings],
                **policy_fields(t),
            }
        )
    stats = reported_stats(graph.stats(), tier, rtype)
    all_findings: list[Finding] = graph.findings() + rollout_findings
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": session.get("id"),
        "tier": str(tier),
        "rollout_type": rtype,
        "ok": rollout_ok(graph, rollout_findings),
        "reward": _reward(session),
        "metadata": session.get("metadata") or {},
        "stats": stats,
        "paths": [{"nodes": p, "role": graph.role(p)} for p in graph.paths()],
        "sequences": seq_docs,
        "turns": turns,
        "findings": [f.model_dump(mode="json") for f in all_findings],
        "policy": _span(graph),
    }


def policy_fields(turn: Turn) -> dict[str, Any]:
    """A turn's `policy_version` (None: unknown or straddled) and `policy_version_straddled`
    ([before, after] when its call straddled a weight update, else None), as the API's turn
    models carry them."""
    stamp = turn.policy
    straddled = None if stamp is None else stamp.straddled
    return {
        "policy_version": None if stamp is None else stamp.version,
        "policy_version_straddled": None if straddled is None else list(straddled),
    }


def _trace_policy(turn: Turn) -> dict[str, Any]:
    """A trace entry's and a row's `policy_version`, and `policy_version_straddled` only where it
    applies."""
    return {"policy_version": None} if turn.policy is None else turn.policy.fields()


def _span(graph: RolloutGraph) -> dict[str, Any] | None:
    span = policy_span(graph.nodes[seq].turn.policy for seq in sorted(graph.nodes))
    return None if span is None else span.model_dump()


def turn_detail(graph: RolloutGraph, seq: int) -> dict[str, Any]:
    """Everything the TUI shows for one turn (`schema.sessions.TurnDetail`): its link, request and
    reply, sampled ids with their texts, logprobs, alternatives and mask. KeyError for a turn the
    graph does not hold."""
    turn = graph.turn(seq)
    link = graph.link(seq)
    sampled, prompt = turn.sampled_ids, turn.prompt_ids
    return {
        "seq": seq,
        "parent": link.parent,
        "link_kind": link.kind,
        "request": turn.request,
        "response": turn.response,
        "prompt_len": None if prompt is None else int(len(prompt)),
        "sampled_ids": None if sampled is None else sampled.tolist(),
        "token_texts": turn.token_texts,
        "logprobs": None if turn.logprobs is None else turn.logprobs.tolist(),
        "top_logprobs": turn.top_logprobs,
        "mask": None if sampled is None else [1 if graph.node_mask_on(seq) else 0] * len(sampled),
        "finish_reason": turn.finish_reason,
        "findings": [f.model_dump(mode="json") for f in [*turn.findings, *link.findings]],
        "sampling": turn.sampling,
        "meta": turn.meta,
        **policy_fields(turn),
        "policy_source": None if turn.policy is None else turn.policy.source,
    }


def graph_view(
    session: dict[str, Any], graph: RolloutGraph, tier: str, *, since: int, findings: Iterable[Finding]
) -> dict[str, Any]:
    """Turn headers from `since` on, every turn's (seq, parent, role), stats and the session's
    findings (`schema.sessions.GraphView`): no token arrays, no messages, no sequences, so a live
    view's refresh costs the new turns, not the whole rollout again."""
    rtype = _rollout_type(session, tier)
    tools = graph.has_tools()
    links, turns = [], []
    for seq in sorted(graph.nodes):
        n = graph.nodes[seq]
        role = graph.node_role(seq, tools=tools)
        links.append((seq, n.parent, role))
        if seq < since:
            continue
        t = n.turn
        turns.append(
            {
                "seq": seq,
                "parent": n.parent,
                "link_kind": n.kind,
                "link_offset": n.offset,
                "capture_mode": capture_mode(t.meta),
                "role": role,
                "token_in": ((t.meta or {}).get("capture_mode") or {}).get("mode"),
                "prompt_len": n.prompt_len if n.has_prompt else None,
                "sampled_len": n.sampled_len if n.sampled is not None else None,
                "finish_reason": t.finish_reason,
                "created_at": t.created_at,
                "findings": [f.model_dump(mode="json") for f in t.findings + n.link_findings],
                **policy_fields(t),
            }
        )
    stats = reported_stats(graph.stats(), tier, rtype)
    return {
        "session_id": session.get("id"),
        "tier": str(tier),
        "rollout_type": rtype,
        "since": since,
        "stats": stats,
        "turns": turns,
        "links": links,
        "findings": [f.model_dump(mode="json") for f in findings],
    }


Reference = tuple[str, dict[int, np.ndarray | None]]
"""A replay as export takes it (`Store.latest_reference`): the reference's name and its logprobs of
each turn's sampled tokens, by turn seq (None: that turn was not scored)."""

REFERENCE_FIELDS = ("reference", "ref_logprobs")
"""A trace entry's metadata and a row's columns that carry a replay's reference logprobs; present
only when the session was replayed."""


def _reference_fields(reference: Reference | None, seq: int, n: int, lists: bool) -> dict[str, Any]:
    if reference is None:
        return {}
    name, by_seq = reference
    arr = by_seq.get(seq)
    if arr is not None and arr.shape != (n,):
        raise ExportError(f"replay {name}'s turn {seq} holds {arr.size} logprobs for {n} sampled tokens")
    return {"reference": name, "ref_logprobs": _out(arr, lists)}


def training_trace(
    session: dict[str, Any],
    graph: RolloutGraph,
    tier: str,
    *,
    lists: bool = True,
    reference: Reference | None = None,
) -> dict[str, Any]:
    """Per-call training data: one entry per agent turn (each call once, arrival order).

    Each entry is shaped as OpenEnv's strict `TrainingTurn`, which TRL's loop-owning worker reads:
    a string `node_id`, `prompt_token_ids` (exactly the engine's), `completion_token_ids`,
    `per_token_logps` (finite and non-positive for every completion token, see `_trace_logps`),
    `loss_mask` over prompt+completion (prompt all 0; completion 1 only when the turn's logprobs are
    aligned and valid), `request`, and `response` as a chat completion (`choices[0].message`, tool
    calls nested). With a `reference` (a replay), each entry's metadata also holds the
    reference's name and its logprobs of the completion tokens (`REFERENCE_FIELDS`). Raises
    ExportRefused for eval rollouts.
    """
    rtype = _rollout_type(session, tier)
    if not is_train(tier, rtype):
        raise ExportRefused(
            f"session {session.get('id')} is an eval rollout (tier {tier}, "
            f"rollout type {rtype}): no training trace; export the rollout "
            "document instead"
        )
    tools = graph.has_tools()
    entries = []
    for seq in sorted(graph.nodes):
        n = graph.nodes[seq]
        if graph.node_role(seq, tools=tools) != "agent" or not n.has_prompt or n.sampled is None:
            continue
        prompt = graph.full_prompt(seq)
        on = graph.node_mask_on(seq, tools=tools)
        mask = np.zeros(prompt.size + n.sampled.size, dtype=np.int8)
        if on:
            mask[prompt.size :] = 1
        t = n.turn
        logps, filled = _trace_logps(t.logprobs, int(n.sampled.size), lists)
        entries.append(
            {
                "node_id": str(seq),
                "prompt_token_ids": _out(prompt, lists),
                "completion_token_ids": _out(n.sampled, lists),
                "per_token_logps": logps,
                "loss_mask": _out(mask, lists),
                "request": t.request or {},
                "response": {
                    "choices": [
                        {"message": nest_tool_calls(t.response or {}), "finish_reason": t.finish_reason}
                    ]
                },
                "metadata": {
                    "session_id": session.get("id"),
                    "parent": n.parent,
                    "link_kind": n.kind,
                    "capture_mode": capture_mode(t.meta),
                    "link_offset": n.offset,
                    "finish_reason": t.finish_reason,
                    "trainable": on,
                    "logprobs_filled": filled,
                    # Here, not beside `per_token_logps`: OpenEnv's TrainingTurn takes no other key.
                    "routed_experts": routing_text(t.routed_experts),
                    "sampling": t.sampling,
                    "meta": t.meta,
                    "created_at": t.created_at,
                    "findings": [f.model_dump(mode="json") for f in t.findings + n.link_findings],
                    # In the metadata: OpenEnv's TrainingTurn forbids fields of its own.
                    **_trace_policy(t),
                    **_reference_fields(reference, seq, int(n.sampled.size), lists),
                },
            }
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": session.get("id"),
        "tier": str(tier),
        "reward": _reward(session),
        "turns": entries,
    }


SESSION_REWARD: Any = object()
"""`trace_rows`'s default reward: the one the runner annotated on the session."""


def trace_rows(
    session: dict[str, Any],
    graph: RolloutGraph,
    tier: str,
    *,
    group_id: str | None = None,
    rollout_id: str | None = None,
    reward: float | None = SESSION_REWARD,
    reference: Reference | None = None,
) -> list[dict[str, Any]]:
    """Rows for a run file: one per trainable-capable agent turn, with group id and reward.

    `reward` defaults to the session's annotated reward. A reward given, None included, is the
    one written: a run's result that says "never graded" stays null even when the session's
    metadata holds a number. Eval rollouts give no rows. A `reference` (a replay) adds the
    `reference` and `ref_logprobs` columns.
    """
    try:
        trace = training_trace(session, graph, tier, lists=False, reference=reference)
    except ExportRefused:
        return []
    if reward is SESSION_REWARD:
        reward = trace["reward"]
    return [
        {
            "rollout_id": rollout_id or session.get("id"),
            "group_id": group_id,
            "session_id": session.get("id"),
            "reward": reward,
            **{k: v for k, v in entry["metadata"].items() if k in POLICY_FIELDS + REFERENCE_FIELDS},
        }
        | entry
        | {"metadata": {k: v for k, v in entry["metadata"].items() if k not in REFERENCE_FIELDS}}
        for entry in trace["turns"]
    ]


POLICY_FIELDS = ("policy_version", "policy_version_straddled")
"""A row's columns that say which policy sampled its turn (`policy_fields`)."""


def _policy_versions(rows: list[dict[str, Any]]) -> Iterator[Any]:
    """Every version a run's rows name, straddled readings included (None left out)."""
    for row in rows:
        if row.get("policy_version") is not None:
            yield row["policy_version"]
        yield from (v for v in row.get("policy_version_straddled") or () if v is not None)


def _as_labels(value: Any) -> Any:
    """A version, or a straddled pair, as labels (the column type when an engine named one)."""
    if isinstance(value, list):
        return [None if v is None else str(v) for v in value]
    return None if value is None else str(value)


_ARRAY_TYPES = {
    "prompt_token_ids": "int32",
    "completion_token_ids": "int32",
    "loss_mask": "int8",
    "per_token_logps": "float64",
    "ref_logprobs": "float64",
}
_TYPED_SCALARS = {
    "rollout_id": "string",
    "group_id": "string",
    "session_id": "string",
    "node_id": "string",
    "run_id": "string",
    "task": "string",
    "error_kind": "string",
    "reference": "string",
    "ok": "bool_",
}


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """One JSON object per line (numpy arrays written as lists). Returns the path. The file is
    replaced whole or, on any failure, left as it was (proxy/store/atomic_write.py)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE
    with atomic_write(path) as f:
        for row in rows:
            f.write(orjson.dumps(row, option=opts))
    return path


def write_parquet(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Parquet for a whole run: token columns as typed lists, nested dicts as JSON strings. The
    file is replaced whole or, on any failure, left as it was (proxy/store/atomic_write.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    columns = {}
    for key in keys:
        values = [row.get(key) for row in rows]
        if key in _ARRAY_TYPES:
            values = [
                None
                if v is None
                else np.asarray(
                    [np.nan if x is None else x for x in v] if isinstance(v, list) else v,
                    dtype=_ARRAY_TYPES[key],
                )
                for v in values
            ]
            columns[key] = pa.array(values, type=pa.list_(getattr(pa, _ARRAY_TYPES[key])()))
        elif key in POLICY_FIELDS:
            # One type for both columns: step numbers as ints, unless some engine named its versions.
            int_versions = all(type(v) is int for v in _policy_versions(rows))
            element = pa.int64() if int_versions else pa.string()
            columns[key] = pa.array(
                values if int_versions else [_as_labels(v) for v in values],
                type=pa.list_(element) if key == "policy_version_straddled" else element,
            )
        elif key == "reward":
            columns[key] = pa.array([None if v is None else float(v) for v in values], type=pa.float64())
        elif key in _TYPED_SCALARS:
            # Typed even when every row holds null (a run whose rollouts all ended ok has no
            # error_kind): a null-typed column cannot be read together with another run's file.
            columns[key] = pa.array(values, type=getattr(pa, _TYPED_SCALARS[key])())
        elif any(isinstance(v, (dict, list)) for v in values):
            columns[key] = pa.array(
                [
                    None
                    if v is None
                    else orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()
                    for v in values
                ],
                type=pa.string(),
            )
        else:
            columns[key] = pa.array(values)
    # Opened here, not by pyarrow: its OSError names no file, so a path that cannot be written
    # would surface as a traceback instead of the one line that names it.
    with atomic_write(path) as f:
        pq.write_table(pa.table(columns), f)
    return path
