"""The real agent CLIs (codex, claude-code, gemini-cli, opencode, qwen-code, mini-swe-agent) run a
sample task end to end: installed from their registries by tapdeck (pinned, cached), run on the
host sandbox with the network cut to loopback, every model call through the capture proxy to the
embedded engine, graded by the task's verifier.

The 135M model never solves the task (reward 0) and rarely makes a usable tool call: each agent
ends by its own turn limit, or by the session's call budget (its stop reply ends the loop).
Skipped when the registries cannot be reached (the install fails with a network error). The
sample-task test runs each agent with its lean tool profile (shell, edit, write, read: first
prompts of 4.2-9.6k tokens instead of 7.8-17.2k), all six on every test run, as do the
dead-engine tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_clis import AGENT_CONTEXT, installed_or_skip
from tests.support.runner_server import RunnerServer, runner_server_on

pytestmark = pytest.mark.slow

# Smallest first prompt first.
AGENTS = ["mini-swe-agent", "opencode", "codex", "gemini-cli", "claude-code", "qwen-code"]
REASKS = {"mini-swe-agent"}
"""Agents that never resend a reply they rejected: a small model's calls do not chain for them."""
TURNS = 2
BUDGET = 3
"""Model calls per rollout: the agent's turns plus an auxiliary call (opencode's title)."""


def start_engine(n_ctx: int = AGENT_CONTEXT) -> Any:
    """An embedded engine of its own: the agents need its context above the 8k default."""
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.runner.engine.embedded import EmbeddedEngine

    return EmbeddedEngine(n_ctx=n_ctx).start()


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerServer]:
    """A tapdeck server whose default engine holds the agents' prompts."""
    engine = start_engine()
    try:
        with runner_server_on(engine, tmp_path_factory.mktemp("tapdeck-agents")) as server:
            yield server
    finally:
        engine.stop()


def _only(doc: dict[str, Any]) -> dict[str, Any]:
    assert len(doc["rollouts"]) == 1, doc
    return doc["rollouts"][0]


def _agent_output(rollout: dict[str, Any], name: str) -> str:
    path = Path(rollout["trial_dir"]) / "agent" / f"{name}.txt"
    return path.read_text()[-3000:] if path.is_file() else "(no output kept)"


def task_kwargs(name: str) -> dict[str, Any]:
    """The sample-task run's agent settings: two turns, and the lean tool profile where the agent
    has one (its first prompt a third to a half smaller, so a CPU engine prefills it in CI)."""
    from tapdeck.runner.cli_agents import CLI_AGENTS

    return {"max_turns": TURNS, **({"tool_profile": "lean"} if CLI_AGENTS[name].LEAN_TOOLS else {})}


@pytest.mark.parametrize("name", AGENTS)
def test_agent_cli_runs_a_sample_task_offline_with_every_turn_captured(
    agent_server: RunnerServer, name: str
) -> None:
    """Over 120 s for qwen-code and gemini-cli (224 s and 146 s in a loaded full run): the embedded
    engine prefills each agent's own first prompt (9.6k and 8.2k tokens with the lean tools) at
    ~40-60 tokens/s on 2 cores, and a smaller prompt would no longer be the agent's real one."""
    installed_or_skip(name)
    started = time.monotonic()
    run = agent_server.start(
        tasks=["hello-file"],
        harness=name,
        timeout_s=2100,
        agent_timeout_s=1800,
        call_budget=BUDGET,
        agent_kwargs=task_kwargs(name),
        # The embedded engine's chat route parses hermes tool calls: named,
        # token-in continues calls with tools by ids (else `tool_parser_unknown`).
        engine_tool_parser="hermes",
    )
    r = _only(agent_server.wait(run["id"], timeout_s=2200))  # the rollout's own limit, then some
    wall = time.monotonic() - started
    output = _agent_output(r, name)
    # The agent ran its own loop and ended it (exit 0), or was ended by the budget's stop reply.
    assert r["error_kind"] in (None, "agent_failed"), (r["error"], output)
    assert r["reward"] == 0.0 or r["reward"] == 1.0, (r, output)
    assert "reward" in r["rewards"]
    assert r["tier"] == "tokens" and r["turns"] >= 1, (r, output)

    http = agent_server.http
    doc = http.get(f"/admin/sessions/{r['session_id']}/rollout").json()
    agent_turns = [t for t in doc["turns"] if t["role"] == "agent"]
    assert agent_turns, (doc["turns"], output)
    for t in doc["turns"]:
        turn = http.get(f"/admin/sessions/{r['session_id']}/turns/{t['seq']}").json()
        assert turn["prompt_len"] and turn["prompt_len"] > 0
        assert turn["sampled_ids"] and all(isinstance(i, int) for i in turn["sampled_ids"])
        assert len(turn["logprobs"]) == len(turn["sampled_ids"])
    roots = [t for t in agent_turns if t["parent"] is None]
    shape = [(t["seq"], t["parent"], t["link_kind"], t["finish_reason"]) for t in doc["turns"]]
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
    first = min(agent_turns, key=lambda t: t["seq"])
    # From the rollout's start: a call the agent gave up on and re-sent still took this long.
    first_answer = first["created_at"] - r["started_at"]
    print(
        f"\n{name}: exit={r['error_kind'] or 'ok'} turns={r['turns']} "
        f"agent={len(agent_turns)} roles={[t['role'] for t in doc['turns']]} "
        f"first_prompt={first['prompt_len']} tokens first_answer={first_answer:.0f}s after start "
        f"(its own call {first['meta'].get('latency_ms', 0) / 1000:.1f}s) "
        f"agent_phase={r['timings'].get('agent_execution', 0):.0f}s wall={wall:.0f}s "
        f"shape={shape} modes={[(t['meta'] or {}).get('capture_mode') for t in doc['turns']]}"
    )


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
