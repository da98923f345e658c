"""Harness seams: AgentConfig building, the session key as the only credential."""

from __future__ import annotations

from pathlib import Path

import pytest
from harbor.agents.agent_auth_resolution import resolve_agent_model_connection
from harbor.agents.factory import AgentFactory
from harbor.models.trial.config import AgentConfig

from tapdeck.runner.harnesses import (
    HARNESSES,
    Placement,
    RunDefaults,
    build_agent_config,
    build_agent_pieces,
    get_harness,
    harness_table,
    strip_secrets,
)

BASE_URLS = {
    "openai": "http://127.0.0.1:8300/v1",
    "anthropic": "http://127.0.0.1:8300",
    "google": "http://127.0.0.1:8300",
}
SESSION_KEY = "tdk-session-key-123"
REAL_KEYS = {
    "OPENAI_API_KEY": "sk-real-openai",
    "ANTHROPIC_API_KEY": "sk-ant-real",
    "ANTHROPIC_AUTH_TOKEN": "sk-ant-real-token",
    "GEMINI_API_KEY": "real-gemini",
    "GOOGLE_API_KEY": "real-google",
    "LLM_API_KEY": "real-llm",
}
MODEL_HARNESSES = [
    name for name, h in HARNESSES.items() if h.makes_model_calls and h.placement is not Placement.HOST_INSTALL
]
CLI_HARNESSES = [name for name, h in HARNESSES.items() if h.placement is Placement.HOST_INSTALL]


def _build(name: str, **kw) -> AgentConfig:
    return build_agent_config(
        name, base_urls=BASE_URLS, session_key=SESSION_KEY, served_model="smollm2", **kw
    )


def test_terminus2_gets_the_small_model_defaults() -> None:
    cfg = _build("terminus-2")
    assert cfg.name == "terminus-2"
    assert cfg.model_name == "openai/smollm2"
    assert cfg.base_url == "http://127.0.0.1:8300/v1"
    assert cfg.model_api_format == "openai_chat_completions"
    assert cfg.override_timeout_sec == 180.0
    k = cfg.kwargs
    assert k["collect_rollout_details"] is True
    assert k["record_terminal_session"] is False
    assert k["enable_summarize"] is False
    assert k["max_turns"] == 3
    assert k["model_info"] == {
        "max_input_tokens": 8192,
        "max_output_tokens": 128,
        "input_cost_per_token": 0.0,
        "output_cost_per_token": 0.0,
    }
    assert k["llm_kwargs"] == {"max_tokens": 128, "api_key": SESSION_KEY}


def test_hosted_vllm_prefix_on_request_and_only_for_valid_names() -> None:
    vllm = RunDefaults(model_prefix="hosted_vllm/", context_tokens=32768)
    assert _build("terminus-2", defaults=vllm).model_name == "hosted_vllm/smollm2"
    assert _build("terminus-2", defaults=vllm).kwargs["model_info"]["max_input_tokens"] == 32768
    odd = build_agent_config(
        "terminus-2",
        base_urls=BASE_URLS,
        session_key=SESSION_KEY,
        served_model="Qwen/Qwen3-8B",
        defaults=vllm,
    )
    assert odd.model_name == "openai/Qwen/Qwen3-8B"


def test_agent_kwargs_override_defaults() -> None:
    cfg = _build("terminus-2", agent_kwargs={"max_turns": 2, "temperature": 0.7})
    assert cfg.kwargs["max_turns"] == 2 and cfg.kwargs["temperature"] == 0.7


@pytest.mark.parametrize("name", ["oracle", "nop"])
def test_no_model_harnesses_get_no_model_overrides(name: str) -> None:
    cfg = build_agent_config(name, base_urls=None, session_key=None, served_model=None)
    assert cfg.name == name and cfg.model_name is None and cfg.base_url is None
    assert cfg.model_api_format is None and cfg.env == {}


@pytest.mark.parametrize("name", MODEL_HARNESSES)
def test_harbor_resolves_only_the_session_key_even_with_real_keys_on_the_host(name: str, monkeypatch) -> None:
    for var, value in REAL_KEYS.items():
        monkeypatch.setenv(var, value)
    cfg = _build(
        name,
        extra_env={
            "OPENAI_API_KEY": "sk-real-openai",
            "AWS_SECRET_ACCESS_KEY": "aws-real-secret",
            "HF_TOKEN": "hf_real",
            "MY_FLAG": "1",
        },
    )
    real = set(REAL_KEYS.values()) | {"aws-real-secret", "hf_real"}
    assert not real & set(cfg.env.values()), cfg.env
    assert cfg.env["MY_FLAG"] == "1"
    assert not any(v in str(cfg.kwargs) for v in real)
    connection = resolve_agent_model_connection(cfg)
    assert connection.api_key == SESSION_KEY
    assert not real & {str(v) for v in connection.env.values()}, connection.env
    assert connection.resolved_base_url == cfg.base_url


def test_base_url_goes_to_the_dialect_route() -> None:
    assert _build("claude-code").kwargs["proxy_url"] == BASE_URLS["anthropic"]
    assert _build("gemini-cli").kwargs["proxy_url"] == BASE_URLS["google"]
    assert _build("codex").kwargs["proxy_url"] == BASE_URLS["openai"]
    assert _build("mini-swe-agent").kwargs["proxy_url"] == BASE_URLS["openai"]
    assert _build("goose").env["OPENAI_HOST"] == BASE_URLS["openai"]


@pytest.mark.parametrize("name", CLI_HARNESSES)
def test_agent_clis_get_only_the_session_key_and_the_proxy(name: str, monkeypatch, tmp_path) -> None:
    from tapdeck.runner import cli_agents

    for var, value in REAL_KEYS.items():
        monkeypatch.setenv(var, value)
    cfg = _build(name, extra_env={"OPENAI_API_KEY": "sk-real-openai", "MY_FLAG": "1"})
    assert cfg.import_path.startswith("tapdeck.runner.cli_agents:") and cfg.base_url is None
    assert cfg.model_name == "smollm2" and cfg.kwargs["max_turns"] == 3
    assert not set(REAL_KEYS.values()) & set(cfg.env.values()), cfg.env
    agent = AgentFactory.create_agent_from_config(cfg, logs_dir=tmp_path)
    assert isinstance(agent, cli_agents.CliAgent) and agent.name() == name
    agent.entry = tmp_path / "bin" / name
    env = agent.env()
    everything = " ".join([*env.values(), agent.command("do it"), *agent.config_files().values()])
    assert not any(v in everything for v in REAL_KEYS.values()), everything
    credentials = {k: v for k, v in env.items() if "KEY" in k}
    assert credentials and set(credentials.values()) == {SESSION_KEY}
    assert env["HOME"] == cli_agents.AGENT_HOME and env["TMPDIR"] == cli_agents.AGENT_TMP
    assert cfg.kwargs["proxy_url"] in everything


def test_model_harness_without_a_session_is_refused() -> None:
    with pytest.raises(ValueError, match="session key"):
        build_agent_config("terminus-2", base_urls=None, session_key=None, served_model=None)


def test_any_harbor_import_path_is_an_unvalidated_harness() -> None:
    row = get_harness("my_pkg.agents:MyAgent")
    assert not row.validated and row.placement is Placement.INSTALLED
    pieces = build_agent_pieces(row, base_urls=BASE_URLS, session_key=SESSION_KEY, served_model="m")
    assert pieces.import_path == "my_pkg.agents:MyAgent" and pieces.name is None
    assert pieces.env["OPENAI_API_KEY"] == SESSION_KEY
    with pytest.raises(KeyError, match="terminus-2"):
        get_harness("no-such-harness")


def test_every_table_row_names_a_loadable_harbor_agent() -> None:
    for row in HARNESSES.values():
        AgentFactory.get_agent_class_from_config(AgentConfig(name=row.agent))


def test_strip_secrets_keeps_the_session_key_only() -> None:
    env = {"OPENAI_API_KEY": SESSION_KEY, "GITHUB_TOKEN": "ghp", "DB_PASSWORD": "p", "LANG": "C"}
    assert strip_secrets(env, SESSION_KEY) == {"OPENAI_API_KEY": SESSION_KEY, "LANG": "C"}


def test_table_rows_are_plain_and_only_what_ran_here_is_validated() -> None:
    rows = {r["name"]: r for r in harness_table()}
    assert {
        "terminus-2",
        "oracle",
        "nop",
        "mini-swe-agent",
        "opencode",
        "codex",
        "claude-code",
        "gemini-cli",
        "goose",
        "openhands-sdk",
        "qwen-code",
    } <= set(rows)
    assert rows["oracle"]["validated"] and rows["nop"]["validated"] and rows["terminus-2"]["validated"]
    installed = [r for r in rows.values() if r["placement"] == "installed"]
    assert installed and not any(r["validated"] for r in installed)
    assert rows["terminus-2"]["placement"] == "host-side"
    clis = [r for r in rows.values() if r["placement"] == "host-install"]
    assert len(clis) == 6 and all(r["version"] for r in clis)
    # The CLIs that ran a sample task end to end here (tests/runner/test_agent_rollouts.py).
    assert {r["name"] for r in clis if r["validated"]} == {
        "mini-swe-agent",
        "opencode",
        "codex",
        "claude-code",
        "gemini-cli",
        "qwen-code",
    }


def test_an_unknown_tool_profile_is_refused_naming_the_profiles(tmp_path: Path) -> None:
    from tapdeck.runner.cli_agents import CLI_AGENTS

    with pytest.raises(ValueError, match="tool_profile 'tiny' is not one of full, lean"):
        CLI_AGENTS["claude-code"](
            tmp_path, "smollm2", proxy_url="http://127.0.0.1:1/", session_key="k", tool_profile="tiny"
        )


@pytest.mark.parametrize(
    ("name", "code", "output", "ends_its_loop"),
    [
        ("claude-code", 1, "Error: Reached max turns (3)", True),
        ("gemini-cli", 53, "Reached max session turns for this session. Increase the number", True),
        ("qwen-code", 53, "Reached max session turns for this session. Increase the number", True),
        ("claude-code", 1, "API Error: Claude's response exceeded the 512 output token maximum", False),
        ("gemini-cli", 1, "Reached max session turns for this session.", False),  # not its exit code
        ("codex", 1, "ERROR: Incomplete response returned, reason: max_output_tokens", False),
    ],
)
async def test_an_agent_cli_stopped_by_its_own_turn_limit_ends_its_loop_as_terminus2_does(
    tmp_path: Path, name: str, code: int, output: str, ends_its_loop: bool
) -> None:
    from types import SimpleNamespace

    from harbor.agents.installed.base import NonZeroAgentExitCodeError
    from harbor.models.agent.context import AgentContext

    from tapdeck.runner.cli_agents import CLI_AGENTS

    class Sandbox:
        async def exec(self, command: str, **_: object) -> SimpleNamespace:
            return SimpleNamespace(return_code=code, stdout=f"working\n{output}\n", stderr="")

    agent = CLI_AGENTS[name](tmp_path, "smollm2", proxy_url="http://127.0.0.1:1/v1", session_key="k")
    agent.entry = tmp_path / "bin" / name
    context = AgentContext()
    if ends_its_loop:
        await agent.run("do it", Sandbox(), context)  # type: ignore[arg-type]
        assert context.metadata["ended_by_turn_limit"] is True
    else:
        with pytest.raises(NonZeroAgentExitCodeError, match=f"exited with {code}"):
            await agent.run("do it", Sandbox(), context)  # type: ignore[arg-type]
        assert context.metadata["ended_by_turn_limit"] is False
