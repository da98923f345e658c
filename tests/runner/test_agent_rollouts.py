"""The real agent CLIs (codex, claude-code, gemini-cli, opencode, qwen-code, mini-swe-agent) run a
sample task end to end on the defaults: installed from their registries by tapdeck (pinned,
cached), run on the host sandbox with the network cut to loopback, every model call through the
capture proxy to the embedded engine (the server's default, as `tapdeck rollout` starts it),
graded by the task's verifier. The test passes no setting of its own: tool profile, output limit,
turns, call budget and timeouts are what `tapdeck rollout --harness NAME` gets.

Each rollout must make at least 2 agent calls and end by the agent's own loop, its turn limit or
the session's call budget, never by a tapdeck default (an agent timeout or hard limit, an output
limit the agent does not survive: `output_cap`). The 135M model never solves the task and rarely
makes a tool call, so where its own output ends a rollout sooner, the end is named from the
capture and accepted as the model's, explicitly (`model_caused`): a first reply of text without a
tool call, which ends the loop of every agent but mini-swe-agent; a reply that rambled on to the
embedded engine's runaway bound (512 tokens, past every reply the model was seen to end by
itself), which ends gemini-cli's, qwen-code's and opencode's loop, and which codex (at once) and
claude-code (after 3 resumes) exit on (`model_output`).
A competent model is the fake vLLM answering as one would: on a served engine's defaults (engine
URL, nothing else set) every agent reaches reward 1 in at least 2 calls, its own output request
standing. Skipped when the registries cannot be reached (the install fails with a network error).
The dead-engine tests run each agent against an embedded engine of their own, reached by URL, with
their own timeouts and budget.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_clis import (
    AGENT_CONTEXT,
    SOLVE,
    engine_for_agents,
    installed_or_skip,
    scripted_agent_reply,
)
from tests.support.fake_vllm import not_a_probe
from tests.support.runner_server import RunnerServer

pytestmark = pytest.mark.slow

# Smallest first prompt first.
AGENTS = ["mini-swe-agent", "opencode", "codex", "gemini-cli", "claude-code", "qwen-code"]
REASKS = {"mini-swe-agent"}
"""Agents that never resend a reply they rejected: a small model's calls do not chain for them."""
TURNS = 2
BUDGET = 3
"""Model calls per rollout in the dead-engine tests: the agent's turns plus an auxiliary call."""
TAPDECK_LIMITS = {"agent_timeout", "timeout", "output_cap", "settings_do_not_fit"}
"""Error kinds that are a tapdeck default failing the agent: none may end a rollout here."""
SAMPLE_TASK = "hello-file"


def start_engine(n_ctx: int = AGENT_CONTEXT) -> Any:
    """An embedded engine of its own, reached by URL (the dead-engine tests stop it)."""
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.runner.engine.embedded import EmbeddedEngine

    return EmbeddedEngine(n_ctx=n_ctx).start()


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerServer]:
    """A tapdeck server started as `tapdeck rollout` starts one: its default engine is the
    embedded one (32,768 tokens of context), so rollouts get the embedded engine's defaults."""
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    data = tmp_path_factory.mktemp("tapdeck-agents")
    with pytest.MonkeyPatch.context() as env:
        # An engine of this test's own, not one another process announced (and may stop).
        env.setenv("TAPDECK_ENGINE_REGISTRY", str(tmp_path_factory.mktemp("engine-registry")))
        local = LocalServer(ServerConfig(port=0, data_dir=data)).start()
    server = RunnerServer(local, data)
    try:
        yield server
    finally:
        server.http.close()
        local.stop()


def _only(doc: dict[str, Any]) -> dict[str, Any]:
    assert len(doc["rollouts"]) == 1, doc
    return doc["rollouts"][0]


def _agent_output(rollout: dict[str, Any], name: str) -> str:
    path = Path(rollout["trial_dir"]) / "agent" / f"{name}.txt"
    return path.read_text()[-3000:] if path.is_file() else "(no output kept)"


def _output_limit(body: dict[str, Any]) -> int | None:
    """A chat body's output limit, under either of its names."""
    limit = body.get("max_tokens", body.get("max_completion_tokens"))
    return limit if isinstance(limit, int) else None


def _ended_by_turn_limit(rollout: dict[str, Any]) -> bool:
    """Whether the agent CLI said its own turn limit ended it (Harbor keeps the agent's metadata)."""
    import json

    result = Path(rollout["trial_dir"]) / "result.json"
    if not result.is_file():
        return False
    metadata = (json.loads(result.read_text()).get("agent_result") or {}).get("metadata") or {}
    return bool(metadata.get("ended_by_turn_limit"))


def how_it_ended(
    name: str, rollout: dict[str, Any], agent_turns: list[dict[str, Any]], budget: int
) -> tuple[str, str]:
    """(`agent_loop` | `turn_limit` | `call_budget` | `model_caused` | `tapdeck_limit` |
    `failure`, why): how a rollout on the defaults ended, read from its result and its capture."""
    from tapdeck.runner.cli_agents import CLI_AGENTS
    from tapdeck.runner.rollout_settings import RUNAWAY_OUTPUT_TOKENS

    kind = rollout["error_kind"]
    if kind in TAPDECK_LIMITS:
        return "tapdeck_limit", f"{kind}: {rollout['error']}"
    if kind == "model_output":
        return "model_caused", rollout["error"]
    if kind is not None:
        return "failure", f"{kind}: {rollout['error']}"
    if rollout["turns"] >= budget:
        return "call_budget", f"the session's {budget} calls were spent"
    if _ended_by_turn_limit(rollout):
        return "turn_limit", f"{name} reached its turn limit"
    last = max(agent_turns, key=lambda t: t["seq"])
    if len(agent_turns) >= 2:
        return "agent_loop", f"{name} ended its own loop (last reply: {last['finish_reason']})"
    message = ((last["response"] or {}).get("choices") or [{}])[0].get("message") or {}
    if (
        last["finish_reason"] == "length"
        and name in CLI_AGENTS
        and last["sampled_len"] >= RUNAWAY_OUTPUT_TOKENS
    ):
        return "model_caused", (
            f"its reply ran {last['sampled_len']} tokens to the runaway bound "
            f"without ending, and {name} ends its loop on a cut reply"
        )
    if last["finish_reason"] == "stop" and not message.get("tool_calls"):
        return "model_caused", (
            f"the model answered with text and no tool call "
            f"({last['sampled_len']} tokens), which ends {name}'s loop"
        )
    return "agent_loop", f"{name} ended its own loop after one call ({last['finish_reason']})"


@pytest.mark.parametrize("name", AGENTS)
def test_agent_cli_runs_a_sample_task_on_the_defaults_with_every_turn_captured(
    agent_server: RunnerServer, name: str
) -> None:
    """Over 120 s for gemini-cli, qwen-code and claude-code: the embedded engine prefills each
    agent's own first prompt (4-10k tokens with the lean tools) at 60-125 tokens/s on 2 cores (load
    2-5, 2026-12-07), and a reply that rambles on decodes to the runaway bound (512 tokens) at
    11-44 tokens/s, four times over for claude-code, which resumes a cut reply 3 times; a smaller
    prompt or limit would no longer be the defaults."""
    from tapdeck.runner.rollout import BUDGET_PER_TURN
    from tapdeck.runner.rollout_settings import HARNESS_DEFAULTS

    installed_or_skip(name)
    started = time.monotonic()
    run = agent_server.start(tasks=[SAMPLE_TASK], harness=name)  # nothing else: the defaults
    # Its own hard limit ends it first; the wait only guards against a hung server.
    r = _only(agent_server.wait(run["id"], timeout_s=4 * 3600))
    wall = time.monotonic() - started
    output = _agent_output(r, name)
    settings, row = r["settings"], HARNESS_DEFAULTS[name]
    assert settings is not None, (r["error_kind"], r["error"])
    # The embedded engine's row of the defaults table, each value saying so.
    profile = row.embedded_tool_profile  # lean, where the agent has that profile
    assert (settings["tool_profile"], settings["tool_profile_source"]) == (
        profile,
        "harness-default" if profile else None,
    )
    assert (settings["max_output_tokens"], settings["max_output_source"]) == (
        row.embedded_output_tokens,
        "harness-default",
    )
    assert settings["agent_timeout_source"] == "harness-default", settings
    assert settings["agent_timeout_s"] > 180.0  # the sample task's own, too short to prefill

    http = agent_server.http
    doc = http.get(f"/admin/sessions/{r['session_id']}/rollout").json()
    agent_turns = [t for t in doc["turns"] if t["role"] == "agent"]
    # Its first model call came back within the agent timeout.
    assert agent_turns, (r["error_kind"], r["error"], doc["turns"], output)
    budget = BUDGET_PER_TURN * settings["max_turns"]
    ended, why = how_it_ended(name, r, agent_turns, budget)
    shape = [
        (t["seq"], t["parent"], t["link_kind"], t["finish_reason"], t["sampled_len"]) for t in doc["turns"]
    ]
    first = min(agent_turns, key=lambda t: t["seq"])
    print(
        f"\n{name}: ended={ended} ({why}) error={r['error_kind'] or 'ok'} calls={r['turns']} "
        f"agent={len(agent_turns)} roles={[t['role'] for t in doc['turns']]} "
        f"first_prompt={first['prompt_len']} tokens first_answer="
        f"{first['created_at'] - r['started_at']:.0f}s after start (its own call "
        f"{first['meta'].get('latency_ms', 0) / 1000:.1f}s) agent_phase="
        f"{r['timings'].get('agent_execution', 0):.0f}s of {settings['agent_timeout_s']:g}s "
        f"wall={wall:.0f}s shape={shape} "
        f"modes={[(t['meta'] or {}).get('capture_mode') for t in doc['turns']]}"
    )
    assert ended != "tapdeck_limit", (why, output)
    assert ended != "failure", (why, output)
    if ended != "model_caused":
        assert len(agent_turns) >= 2, (ended, why, shape, output)
    # Where its own loop asks again after the small model's reply (mini-swe-agent after any reply
    # it rejects, claude-code resuming a cut one), the defaults let it: a second call came back.
    if name in REASKS or (row.on_cut_reply == "retries" and first["finish_reason"] == "length"):
        assert len(agent_turns) >= 2, (ended, why, shape, output)
    assert r["reward"] in (0.0, 1.0) and "reward" in r["rewards"], (r, output)
    assert r["tier"] == "tokens", r

    for t in doc["turns"]:
        turn = http.get(f"/admin/sessions/{r['session_id']}/turns/{t['seq']}").json()
        assert turn["prompt_len"] and turn["prompt_len"] > 0
        assert turn["sampled_ids"] and all(isinstance(i, int) for i in turn["sampled_ids"])
        assert len(turn["logprobs"]) == len(turn["sampled_ids"])
    roots = [t for t in agent_turns if t["parent"] is None]
    if name in REASKS:
        # It drops a reply it rejects (no tool call, or cut by max_tokens) and asks again from
        # before it: each call is a root of its own, and the capture says so.
        assert len(roots) == len(agent_turns), shape
        assert len(roots) == 1 or any(f["code"] == "every_call_a_root" for f in doc["findings"]), doc[
            "findings"
        ]
    else:
        # One conversation, one chain: every agent turn hangs off one root.
        assert len(roots) == 1, shape
    # Calls without the tool manifest (a title or router call) are auxiliary, never trained.
    for t in doc["turns"]:
        if not (t["request"] or {}).get("tools"):
            assert t["role"] != "agent" or len(doc["turns"]) == 1, t["seq"]


@pytest.fixture(scope="module")
def dead_engine_runs(agent_server: RunnerServer) -> dict[str, str]:
    """One run per installed agent whose engine dies after its session opened, all started before
    any is waited for: most of each run is the agent's own retry schedule against the proxy's 502s
    (~75 s for opencode and qwen-code), and the schedules then overlap instead of adding up."""
    runs: dict[str, str] = {}
    for name in AGENTS:
        try:
            installed_or_skip(name)
        except pytest.skip.Exception:
            continue  # its test skips with the reason
        # Its context must hold the agent's first prompt, or the rollout is refused before the
        # trial (`settings_do_not_fit`) and the agent never meets the dead engine.
        engine = start_engine()
        run = agent_server.start(
            tasks=["hello-file"],
            harness=name,
            engine=engine.base_url,
            timeout_s=400,
            agent_timeout_s=300,
            call_budget=BUDGET,
            agent_kwargs={"max_turns": TURNS},
        )
        runs[name] = run["id"]
        try:
            # The session probes the live engine; it dies before the agent's first call.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                rollouts = agent_server.http.get(f"/admin/runs/{run['id']}").json()["rollouts"]
                if rollouts and rollouts[0].get("session_id"):
                    break
                time.sleep(0.05)
        finally:
            engine.stop()
    return runs


@pytest.mark.parametrize("name", AGENTS)
def test_dead_engine_ends_the_agent_and_is_engine_unreachable(
    agent_server: RunnerServer, dead_engine_runs: dict[str, str], name: str
) -> None:
    installed_or_skip(name)
    r = _only(agent_server.wait(dead_engine_runs[name]))
    output = _agent_output(r, name)
    print(f"\n{name}: dead engine, agent_phase={r['timings'].get('agent_execution', 0):.0f}s")
    assert not r["ok"] and r["error_kind"] == "engine_unreachable", (r, output)
    assert r["turns"] == 0 and r["reward"] is not None  # the verifier still ran
    # The agent itself gave up on the proxy's 502s (its retries cut to one where a setting reaches
    # them; opencode's and qwen-code's own schedules take ~75 s).
    assert "NonZeroAgentExitCodeError" in r["error"], (r["error"], output)
    if name == "mini-swe-agent":  # a plain traceback: Typer's rich box took seconds to render
        full = (Path(r["trial_dir"]) / "agent" / f"{name}.txt").read_text()
        assert "Traceback (most recent call last)" in full and "╭" not in full, output


def test_unreachable_public_url_fails_the_rollout_before_any_model_call(agent_server: RunnerServer) -> None:
    import socket

    installed_or_skip("codex")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _only(
        agent_server.run(
            tasks=["hello-file"], harness="codex", timeout_s=300, public_url=f"http://127.0.0.1:{port}"
        )
    )
    assert not r["ok"] and r["error_kind"] == "proxy_unreachable", r
    assert f"http://127.0.0.1:{port}/health" in r["error"] and r["turns"] == 0


@pytest.mark.parametrize("name", AGENTS)
def test_agent_cli_solves_the_sample_task_on_a_served_engines_defaults(
    agent_server: RunnerServer, name: str
) -> None:
    """A competent model behind an engine URL (the fake vLLM answering as one would: the agent's
    shell tool writing the task's file, then "done"), nothing else set: the served engine's defaults
    (the agent's full tools, its own output request, the task's timeout) let every agent run its
    loop to reward 1."""
    from tapdeck.runner.rollout_settings import HARNESS_DEFAULTS

    installed_or_skip(name)
    with engine_for_agents(scripted_agent_reply(name, SOLVE)) as up:
        r = _only(agent_server.run(tasks=[SAMPLE_TASK], harness=name, engine=up.base_url))
        output = _agent_output(r, name)
        settings = r["settings"]
        assert settings is not None, (r["error_kind"], r["error"])
        assert (settings["max_output_tokens"], settings["max_output_source"]) == (None, "default")
        lean = HARNESS_DEFAULTS[name].lean_first_prompt_tokens is not None
        assert (settings["tool_profile"], settings["tool_profile_source"]) == (
            ("full", "default") if lean else (None, None)
        )
        assert (settings["agent_timeout_s"], settings["agent_timeout_source"]) == (180.0, "task")
        assert r["ok"] and r["error_kind"] is None, (r["error"], output)
        assert r["reward"] == 1.0, (r, output)
        doc = agent_server.http.get(f"/admin/sessions/{r['session_id']}/rollout").json()
        agent_turns = [t for t in doc["turns"] if t["role"] == "agent"]
        assert len(agent_turns) >= 2, ([t["role"] for t in doc["turns"]], output)
        # The agent's own output request went to the engine, lowered at most to its context (vLLM
        # clamps within it); where it asked none, the proxy filled in the context.
        for t in agent_turns:
            asked, sent = (
                _output_limit((t["sampling"] or {}).get(k) or {}) for k in ("requested", "submitted")
            )
            assert sent == min(asked or AGENT_CONTEXT, AGENT_CONTEXT), (t["seq"], t["sampling"])
        capped = [
            f["message"]
            for t in doc["turns"]
            for f in agent_server.http.get(f"/admin/sessions/{r['session_id']}/turns/{t['seq']}").json()[
                "findings"
            ]
            if f["code"] == "max_tokens_capped"
        ]
        assert all(m.endswith(f"was sent {AGENT_CONTEXT} (the proxy's cap)") for m in capped), capped
        limits = [_output_limit(b) for b in up.requests if not_a_probe(b)]
        print(
            f"\n{name} on a served engine: calls={r['turns']} agent={len(agent_turns)} "
            f"capped={capped} output limits the engine got={limits}"
        )
