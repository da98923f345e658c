"""The real agent binaries against the capture server in front of an engine answering with vLLM
0.32's recorded bodies: seconds per agent, where the embedded engine takes minutes to prefill their
first prompts.

- Each of the six runs its own tool loop through the proxy in its own dialect (request shapes,
  tool-call round trip, its own way of ending) and leaves hello.txt behind.
- claude-code against a 400 (it answers one by retrying with fewer features, harness-clis.md): it
  stops on its own after a bounded number of tries and prints the refusal's own words.
- What each does with a reply cut at its output limit (the defaults table's `on_cut_reply`), and how
  claude-code, gemini-cli and qwen-code exit when their own turn limit ends them.
- The `lean` tool profile: each binary, set through its own documented settings, sends only the
  tools a coding task needs, still runs its own loop, and its first prompt (rendered with the
  embedded engine's template and tokenizer) is smaller than with its full tool set.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tapdeck.runner import agent_install
from tapdeck.runner.cli_agents import AGENT_ROOT, CLI_AGENTS, HOME_DIRS
from tapdeck.runner.rollout_settings import HARNESS_DEFAULTS
from tests.support.agent_clis import installed_or_skip, scripted_agent_reply
from tests.support.capture_server import CaptureServer
from tests.support.fake_vllm import FakeVllm
from tests.support.vllm_recordings import vllm_fixture, vllm_reply_to

pytestmark = pytest.mark.slow


def recorded_400() -> dict[str, Any]:
    """vLLM 0.32's own 400 body for a request it refuses (it names the parameter)."""
    cases = {c["case"]: c for c in vllm_fixture("errors")["cases"]}
    return cases["stream_options_without_stream"]["body"]


def run_cli(
    name: str,
    info: dict[str, Any],
    root: Path,
    instruction: str,
    timeout_s: float = 180,
    tool_profile: str = "full",
) -> subprocess.CompletedProcess[str]:
    """Run the installed CLI once as tapdeck's Harbor agent would, with its per-trial folders
    under `root` instead of the sandbox's `/installed-agent`."""
    cls = CLI_AGENTS[name]
    dialect_url = {"claude-code": "anthropic", "gemini-cli": "google"}.get(name, "openai")
    agent = cls(
        logs_dir=root / "logs",
        model_name="smollm2",
        tool_profile=tool_profile,
        proxy_url=info["base_urls"][dialect_url],
        session_key=info["api_key"],
    )
    agent.entry = agent_install.entry_path(name)
    assert agent.entry is not None
    env = {k: v.replace(AGENT_ROOT, str(root)) for k, v in agent.env().items()}
    for relative, text in agent.config_files().items():
        path = Path(env["HOME"]) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in (env["TMPDIR"], *(f"{env['HOME']}/{d}" for d in HOME_DIRS)):
        Path(folder).mkdir(parents=True, exist_ok=True)
    work = root / "work"
    work.mkdir()
    env["PATH"] = os.environ["PATH"]
    return subprocess.run(
        ["bash", "-c", agent.command(instruction)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def test_claude_code_gives_up_on_a_400_and_prints_what_was_refused(
    capture: CaptureServer, upstream: FakeVllm, tmp_path: Path
) -> None:
    installed_or_skip("claude-code")
    refusal = recorded_400()
    upstream.answer = lambda body: (400, refusal)
    info = capture.open_session()
    started = time.monotonic()
    done = run_cli("claude-code", info, tmp_path, "create hello.txt containing hi")
    wall = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    # The refusal's own words reach the operator through the agent.
    assert "Stream options can only be defined" in output, output
    # Its model check ("Name one prime number.", no tools), then the task call retried with fewer
    # features each time (tool search off: its deferred tools come inline), then it stops.
    tools = [len(r.get("tools") or []) for r in upstream.requests]
    main = [n for n in tools if n]
    print(
        f"\nclaude-code against a 400: {len(tools)} requests in {wall:.1f} s, tools per request "
        f"{tools}, exit {done.returncode}"
    )
    assert len(tools) - len(main) <= 2, tools
    assert 2 <= len(main) <= 8 and main[-1] > main[0], tools
    assert not (tmp_path / "work" / "hello.txt").exists()
    assert capture.summary(info["id"])["turns"] == 0


@pytest.mark.parametrize("name", list(CLI_AGENTS))
def test_agent_binary_runs_its_own_tool_loop_through_the_proxy(
    capture: CaptureServer, upstream: FakeVllm, tmp_path: Path, name: str
) -> None:
    # Each real binary's request shapes and its own tool loop through the capture server, in
    # seconds: the engine answers with recorded vLLM bodies, as a capable model would.
    installed_or_skip(name)
    upstream.answer = scripted_agent_reply(name)
    info = capture.open_session()
    done = run_cli(name, info, tmp_path, "Create a file hello.txt containing hi.")
    output = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, output
    assert (tmp_path / "work" / "hello.txt").read_text().strip() == "hi", output
    summary = capture.summary(info["id"])
    assert summary["turns"] >= 2 and summary["fatal"] == 0, (summary, output)
    print(f"\n{name}: {summary['turns']} calls captured, findings {summary['findings'][:4]}")
    if name in ("gemini-cli", "qwen-code"):  # their output limits come from settings files
        assert {r.get("max_tokens") for r in upstream.requests if r.get("tools")} == {256}


def test_qwen_code_after_a_length_cut_reply_stays_in_the_tasks_conversation(
    capture: CaptureServer, upstream: FakeVllm, tmp_path: Path
) -> None:
    # Its one run on the embedded engine made two roots: after a reply cut at max_tokens ended
    # its turn, its managed-memory sub-agent sent the conversation under another system prompt
    # and tool set. The per-trial settings turn that sub-agent off.
    installed_or_skip("qwen-code")
    cut = vllm_fixture("chat_length")["response"]
    upstream.answer = lambda body: (200, vllm_reply_to(body, cut))
    info = capture.open_session()
    done = run_cli("qwen-code", info, tmp_path, "Create a file hello.txt containing hi.")
    output = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, output
    task_calls = [r for r in upstream.requests if r.get("tools")]
    assert task_calls, output
    systems = {r["messages"][0]["content"][:200] for r in task_calls}
    assert len(systems) == 1 and "memory extraction" not in next(iter(systems)), systems


@pytest.mark.parametrize("name", list(CLI_AGENTS))
def test_what_each_agent_does_with_a_cut_reply_is_its_row_of_the_defaults_table(
    capture: CaptureServer, upstream: FakeVllm, tmp_path: Path, name: str
) -> None:
    # Every reply cut at max_tokens: the measurement behind `on_cut_reply`, which decides the
    # output limit an agent gets on the embedded engine (codex's own, for one).
    installed_or_skip(name)
    cut = vllm_fixture("chat_length")["response"]
    upstream.answer = lambda body: (200, vllm_reply_to(body, cut))
    info = capture.open_session()
    done = run_cli(name, info, tmp_path, "Create a file hello.txt containing hi.")
    output = (done.stdout + done.stderr)[-3000:]
    calls = [r for r in upstream.requests if r.get("tools")]  # not the probe, not a title call
    behaviour = HARNESS_DEFAULTS[name].on_cut_reply
    print(f"\n{name} on a cut reply: exit {done.returncode}, {len(calls)} calls ({behaviour})")
    if behaviour == "fatal":  # codex: "Incomplete response returned, reason: max_output_tokens"
        assert done.returncode != 0 and len(calls) == 1, output
    elif behaviour == "retries":  # claude-code: "Output token limit hit. Resume directly ..."
        assert done.returncode != 0 and len(calls) == 4, output
        assert all(
            c["messages"][-2] == {"role": "assistant", "content": "The capital of France is"}
            for c in calls[1:]
        ), [c["messages"][-2:] for c in calls[1:]]
    elif behaviour == "ends":
        assert done.returncode == 0 and len(calls) == 1, output
    else:  # re-asks: mini-swe-agent's format error, until its step limit (3 by default)
        assert behaviour == "re-asks" and done.returncode == 0 and len(calls) == 3, output


@pytest.mark.parametrize("name", [n for n, cls in CLI_AGENTS.items() if cls.TURN_LIMIT_EXIT])
def test_an_agents_own_turn_limit_exits_as_its_class_expects(
    capture: CaptureServer, upstream: FakeVllm, tmp_path: Path, name: str
) -> None:
    # A model that calls the shell tool on every turn (a new command each time, or qwen-code's
    # loop detection stops it first) runs the agent into its turn limit (3 by default): its exit
    # code and line are what `CliAgent.run` takes for the end of its loop, not a failure.
    installed_or_skip(name)
    calls = iter(range(100))

    def answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        without_results = {**body, "messages": [m for m in body["messages"] if m["role"] != "tool"]}
        return scripted_agent_reply(name, f"echo {next(calls)} >> log.txt")(without_results)

    upstream.answer = answer
    info = capture.open_session()
    done = run_cli(name, info, tmp_path, "Create a file hello.txt containing hi.")
    code, line = CLI_AGENTS[name].TURN_LIMIT_EXIT or (0, "")
    assert done.returncode == code and line in done.stdout + done.stderr, (
        done.returncode,
        (done.stdout + done.stderr)[-2000:],
    )


LEAN_AGENTS = [n for n, cls in CLI_AGENTS.items() if cls.LEAN_TOOLS]
"""mini-swe-agent has one tool (bash) and a 1k-token prompt: nothing to shrink."""


@pytest.fixture(scope="module")
def engine_text() -> Iterator[tuple[Any, Any]]:
    """The embedded engine's tokenizer and chat template (no forward pass is run)."""
    pytest.importorskip("llama_cpp", reason="the engine's tokenizer needs llama-cpp-python")
    from tapdeck.runner.engine.model import LlamaModel
    from tapdeck.runner.engine.model_file import default_model_path
    from tapdeck.runner.engine.template import ChatTemplate

    model = LlamaModel(default_model_path(), n_ctx=512)
    try:
        yield model, ChatTemplate(model.chat_template)
    finally:
        model.close()


def prompt_parts(body: dict[str, Any], engine_text: tuple[Any, Any]) -> dict[str, int]:
    """Tokens of a chat request as the embedded engine renders it: the whole prompt, the tools'
    share (with minus without them) and the system messages' share."""
    model, template = engine_text

    def count(messages: list[dict[str, Any]], tools: Any = None, gen: bool = True) -> int:
        return len(model.tokenize(template.render(messages, tools=tools, add_generation_prompt=gen)))

    messages = body["messages"]
    total = count(messages, body.get("tools"))
    bare = count(messages)
    system = count([m for m in messages if m["role"] == "system"], gen=False)
    return {"total": total, "tools": total - bare, "system": system, "rest": bare - system}


@pytest.mark.parametrize("name", LEAN_AGENTS)
def test_lean_profile_sends_only_the_task_tools_and_keeps_the_agents_loop(
    capture: CaptureServer, upstream: FakeVllm, tmp_path: Path, name: str, engine_text: tuple[Any, Any]
) -> None:
    installed_or_skip(name)
    upstream.answer = scripted_agent_reply(name)
    info = capture.open_session()
    done = run_cli(name, info, tmp_path, "Create a file hello.txt containing hi.", tool_profile="lean")
    output = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, output
    # Its own loop still ran the shell tool and got to the file.
    assert (tmp_path / "work" / "hello.txt").read_text().strip() == "hi", output
    first = next(r for r in upstream.requests if r.get("tools"))
    sent = {t["function"]["name"] for t in first["tools"]}
    assert sent == set(CLI_AGENTS[name].LEAN_TOOLS), sent
    parts = prompt_parts(first, engine_text)
    full = HARNESS_DEFAULTS[name].first_prompt_tokens
    print(f"\n{name} lean first prompt: {parts} (full: {full})")
    assert parts["total"] < full, parts
