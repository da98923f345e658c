"""Harbor agents that run the real coding-agent CLIs from tapdeck's own installs.

Harbor's installed agents (`harbor.agents.installed.*`) install their CLI inside the sandbox at
setup with scripts that need the internet (nvm from GitHub, uv from astral.sh) and point the CLI at
a real provider. These classes keep Harbor's seam (a `BaseAgent` loaded by `module:Class`, the
instruction run once in the sandbox through `exec`) but run the binary tapdeck installed on the host
(`agent_install`, visible inside the host sandbox, mounted read-only into a docker one), with the
command lines measured here (shared/reference/harness-clis.md):

- a per-trial HOME and TMPDIR under `/installed-agent` (a per-trial directory in the host sandbox),
  so config, caches, session files and the temp files some CLIs leave behind go with the trial;
- telemetry, update checks and other non-essential traffic off (env vars and settings files);
- only the capture session key as a credential, and the proxy as the only endpoint;
- a bounded run: the CLI's own turn/step limit where it has one, the rollout's output limit per
  call where it has one (none: the CLI's own request stands), and the proxy's per-session call
  budget (its synthetic stop reply ends every text-terminated loop).

A non-zero exit raises Harbor's `NonZeroAgentExitCodeError` (the rollout classifies it), except
the one a CLI makes when its own turn limit ends it (claude-code, gemini-cli, qwen-code): that is
the end of its loop, as terminus-2's `max_turns` is. The CLI's output (stdout and stderr) is kept
as `agent/<name>.txt` in the trial folder.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from tapdeck.proxy.upstream.client import ENGINE_READ_TIMEOUT_S
from tapdeck.runner import agent_install
from tapdeck.runner.harbor_api import (
    AgentContext,
    BaseAgent,
    BaseEnvironment,
    NonZeroAgentExitCodeError,
)

AGENT_ROOT = "/installed-agent"
AGENT_HOME = f"{AGENT_ROOT}/home"
AGENT_TMP = f"{AGENT_ROOT}/tmp"
# Nothing listens here: a CLI that would fetch packages at run time (opencode's plugin install)
# fails at once instead of reaching a registry.
DEAD_REGISTRY = "http://127.0.0.1:9/"
# Made in the per-trial HOME before a run (codex refuses a CODEX_HOME that does not exist).
HOME_DIRS = (".codex", ".config", ".cache", ".local/share", ".local/state")
RETRIES = 1
"""Retries per failed model call, where the CLI lets us set them: the proxy is local, so a failure
is the engine's, and the CLIs' own back-off (up to minutes) only delays the rollout's end. No setting
reaches opencode's (5 retries of a 5xx, 2 s doubling to 32 s) or qwen-code's (7 attempts, 1.5 s
doubling to 30 s): a dead engine costs each ~75 s before it exits (measured)."""
IDLE_TIMEOUT_MS = int(ENGINE_READ_TIMEOUT_S + 60) * 1000
"""Request/stream idle limits of 40 minutes, a minute past the proxy's engine read timeout: a CPU
engine prefilling a 12-17k-token prompt on a loaded 2-core machine is silent for 20 minutes or more
(claude-code's first 12.4k-token call outlasted 10), and the agent timeout bounds the run anyway."""
_SETTINGS_OFF = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
}


TOOL_PROFILES = ("full", "lean")
"""`full`: the CLI's own tool set, as it ships (the default: a rollout for training should see
what the agent really sends). `lean`: only the tools a coding task needs (shell, edit, write, read),
set through the CLI's own documented settings; its binary, loop, system prompt and dialect are
unchanged. It cuts the first prompt a CPU engine must prefill (README: "Lean tool profile")."""


class ProxyUnreachableError(RuntimeError):
    """The sandbox cannot reach the capture proxy at the address the session advertises."""


class AgentNotInstalledError(RuntimeError):
    """The agent CLI could not be installed, or the sandbox cannot see tapdeck's install."""


# An HTTP GET from inside the sandbox with whatever client is there (curl, python3, node).
_HEALTH_PROBE = (
    'u={url}; if command -v curl >/dev/null 2>&1; then curl -fsS -m 5 -o /dev/null "$u"; '
    'elif command -v python3 >/dev/null 2>&1; then python3 -c "import sys,urllib.request as r; '
    'r.urlopen(sys.argv[1], timeout=5)" "$u"; '
    'elif command -v node >/dev/null 2>&1; then node -e "fetch(process.argv[1],'
    "{{signal:AbortSignal.timeout(5000)}}).then(r=>process.exit(r.ok?0:1),e=>"
    '{{console.error(String(e.cause||e));process.exit(1)}})" "$u"; '
    'else echo "no curl, python3 or node in the sandbox to check with" >&2; exit 3; fi'
)


def proxy_root(proxy_url: str) -> str:
    """The server root of a dialect base URL (`…/v1` → `…`)."""
    root = proxy_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


async def check_proxy_reachable(environment: BaseEnvironment, proxy_url: str) -> None:
    """GET the proxy's `/health` from inside the sandbox; ProxyUnreachableError if it fails."""
    url = f"{proxy_root(proxy_url)}/health"
    result = await environment.exec(_HEALTH_PROBE.format(url=shlex.quote(url)), timeout_sec=20)
    if result.return_code != 0:
        detail = ((result.stderr or "") + (result.stdout or "")).strip()[-300:]
        raise ProxyUnreachableError(
            f"the sandbox cannot reach the capture proxy at {url} ({detail or 'no answer'}): "
            "sandboxes not on this host need --public-url with an address they can reach (see "
            "the README's SSH reverse tunnel recipe)"
        )


_ERROR_LINE = re.compile(r"\berror\b|\bfailed\b|\bexception\b", re.IGNORECASE)


def exit_reason(output: str) -> str:
    """The line of a CLI's output that says why it stopped: its last line that reads as an error
    (`ERROR: Incomplete response returned…`, `API Error: 400 …`), else its last line. Results keep
    an error's first line, and the tail of the output rarely starts at a line of its own."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    return (errors or lines or ["(no output)"])[-1]


class CliAgent(BaseAgent):
    """One coding-agent CLI, run once on the task's instruction through the capture proxy.

    Kwargs (Harbor `AgentConfig.kwargs`): `proxy_url` (the session's base URL for this CLI's
    dialect), `session_key`, `max_turns`, `max_output_tokens` (None: the CLI's own),
    `context_tokens`, `tool_profile` (`full` or `lean`, see TOOL_PROFILES), `agents_dir` (where
    tapdeck's installs live; default `~/.cache/tapdeck/agents`).
    """

    HARNESS: ClassVar[str] = ""
    """The `agent_install.PACKAGES` key."""
    LEAN_TOOLS: ClassVar[tuple[str, ...]] = ()
    """The tools the `lean` profile keeps: shell, edit, write and read, in the CLI's own names."""
    TURN_LIMIT_EXIT: ClassVar[tuple[int, str] | None] = None
    """The exit code, and the line it prints, when its turn limit ends it (measured)."""

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        *,
        proxy_url: str | None = None,
        session_key: str | None = None,
        max_turns: int = 3,
        max_output_tokens: int | None = 256,
        context_tokens: int = 32768,
        tool_profile: str = "full",
        agents_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir, model_name, **kwargs)
        if not (proxy_url and session_key and model_name):
            raise ValueError(f"{self.name()} needs proxy_url, session_key and a model name")
        if tool_profile not in TOOL_PROFILES:
            raise ValueError(
                f"{self.name()}: tool_profile {tool_profile!r} is not one of {', '.join(TOOL_PROFILES)}"
            )
        self.lean = tool_profile == "lean"
        self.proxy_url = proxy_url.rstrip("/")
        self.session_key = session_key
        self.max_turns = int(max_turns)
        self.max_output_tokens = int(max_output_tokens) if max_output_tokens is not None else None
        self.context_tokens = int(context_tokens)
        self.agents_dir = Path(agents_dir) if agents_dir else None
        self.entry: Path | None = None

    @classmethod
    def name(cls) -> str:
        """tapdeck's harness name."""
        return cls.HARNESS

    def version(self) -> str | None:
        """The pinned version tapdeck installs."""
        return agent_install.get_package(self.HARNESS).version

    async def setup(self, environment: BaseEnvironment) -> None:
        """Install the pinned CLI on the host if needed (on first use), check the sandbox sees it
        and reaches the proxy, and make the per-trial HOME and TMPDIR."""
        try:
            record = await asyncio.to_thread(agent_install.install, self.HARNESS, root=self.agents_dir)
        except agent_install.InstallError as exc:
            raise AgentNotInstalledError(f"{self.name()}: {exc}") from exc
        self.entry = Path(record.path) / record.entry
        check = await environment.exec(
            f"test -x {shlex.quote(str(self.entry))} && mkdir -p {AGENT_TMP} "
            + " ".join(f"{AGENT_HOME}/{d}" for d in HOME_DIRS),
            timeout_sec=30,
        )
        if check.return_code != 0:
            raise AgentNotInstalledError(
                f"{self.name()}: the sandbox cannot see tapdeck's install at {self.entry} (these "
                "agents run from the host's install: use the host sandbox, or docker, which mounts it)"
            )
        await check_proxy_reachable(environment, self.proxy_url)
        await self.write_config(environment)

    # ------------------------------------------------------------ per-CLI parts

    def env(self) -> dict[str, str]:
        """Environment for the CLI: per-trial HOME, TMPDIR and XDG folders, no package registry,
        and this CLI's own variables (the sandbox supplies PATH, where node is)."""
        assert self.entry is not None
        return {
            "HOME": AGENT_HOME,
            "TMPDIR": AGENT_TMP,
            "XDG_CONFIG_HOME": f"{AGENT_HOME}/.config",
            "XDG_DATA_HOME": f"{AGENT_HOME}/.local/share",
            "XDG_CACHE_HOME": f"{AGENT_HOME}/.cache",
            "XDG_STATE_HOME": f"{AGENT_HOME}/.local/state",
            "npm_config_registry": DEAD_REGISTRY,
            "NO_UPDATE_NOTIFIER": "1",
            "CI": "1",
            **self.cli_env(),
        }

    def cli_env(self) -> dict[str, str]:
        """This CLI's variables (base URL, key, telemetry off)."""
        return {}

    def config_files(self) -> dict[str, str]:
        """Files to write under the per-trial HOME: relative path → text."""
        return {}

    def command(self, instruction: str) -> str:
        """The shell command running the CLI once on `instruction`."""
        raise NotImplementedError

    # ------------------------------------------------------------ running

    async def write_config(self, environment: BaseEnvironment) -> None:
        """Upload `config_files()` into the sandbox's per-trial HOME."""
        for relative, text in self.config_files().items():
            with tempfile.TemporaryDirectory(prefix="tapdeck-agent-config-") as scratch:
                local = Path(scratch) / Path(relative).name
                local.write_text(text)
                await environment.upload_file(local, f"{AGENT_HOME}/{relative}")

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        """Run the CLI once; its output goes to `agent/<name>.txt`; a non-zero exit raises."""
        # Teed inside the sandbox, so a run cut by the agent timeout still leaves its output.
        log = f"/logs/agent/{self.name()}.txt"
        command = f"set -o pipefail; {self.command(instruction)} 2>&1 </dev/null | tee {log}"
        result = await environment.exec(command, env=self.env())
        output = result.stdout or ""
        turn_limit = (
            self.TURN_LIMIT_EXIT is not None
            and result.return_code == self.TURN_LIMIT_EXIT[0]
            and self.TURN_LIMIT_EXIT[1] in output
        )
        context.metadata = {
            **(context.metadata or {}),
            "exit_code": result.return_code,
            "cli": self.name(),
            "cli_version": self.version(),
            "ended_by_turn_limit": turn_limit,
        }
        if result.return_code != 0 and not turn_limit:
            tail = output.strip()[-1500:]
            raise NonZeroAgentExitCodeError(
                f"{self.name()} exited with {result.return_code}: {exit_reason(output)}\n"
                f"its output ends (all of it in agent/{self.name()}.txt):\n{tail}"
            )

    def _bin(self) -> str:
        assert self.entry is not None
        return shlex.quote(str(self.entry))


class CodexCli(CliAgent):
    """OpenAI Codex CLI: Responses API through a custom model provider (env_key = session key)."""

    HARNESS = "codex"
    # It edits by `apply_patch` in the shell; no setting removes `request_user_input` (it answers
    # "not supported in exec mode" on its own).
    LEAN_TOOLS = ("exec_command", "write_stdin", "request_user_input")
    # Its documented feature flags and web_search setting.
    LEAN_CONFIG = (
        "features.multi_agent=false",
        "features.goals=false",
        "features.view_image=false",
        'web_search="disabled"',
    )

    def cli_env(self) -> dict[str, str]:
        return {"CODEX_HOME": f"{AGENT_HOME}/.codex", "TAPDECK_SESSION_KEY": self.session_key}

    def command(self, instruction: str) -> str:
        provider = {
            "name": '"tapdeck"',
            "base_url": json.dumps(self.proxy_url),
            "env_key": '"TAPDECK_SESSION_KEY"',
            "wire_api": '"responses"',
            "request_max_retries": str(RETRIES),
            "stream_max_retries": str(RETRIES),
            "stream_idle_timeout_ms": str(IDLE_TIMEOUT_MS),
        }
        config = [
            "model_provider=tapdeck",
            *(f"model_providers.tapdeck.{k}={v}" for k, v in provider.items()),
            "check_for_update_on_startup=false",
            "analytics.enabled=false",
            "feedback.enabled=false",
            f"model_context_window={self.context_tokens}",
            *(
                [f"model_max_output_tokens={self.max_output_tokens}"]
                if self.max_output_tokens is not None
                else []
            ),
            *(self.LEAN_CONFIG if self.lean else ()),
        ]
        flags = " ".join(f"-c {shlex.quote(c)}" for c in config)
        return (
            f"{self._bin()} exec {flags} -m {shlex.quote(self.model_name or '')} "
            "--skip-git-repo-check --ephemeral --dangerously-bypass-approvals-and-sandbox "
            f"--disable plugins -- {shlex.quote(instruction)}"
        )


class ClaudeCodeCli(CliAgent):
    """Claude Code: Anthropic Messages at ANTHROPIC_BASE_URL, non-essential traffic off."""

    HARNESS = "claude-code"
    LEAN_TOOLS = ("Bash", "Write", "Edit", "Read", "DeferredToolPlaceholder")
    """`--tools` takes the first four; it still sends its deferred-tool placeholder."""
    TURN_LIMIT_EXIT = (1, "Error: Reached max turns (")

    def cli_env(self) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": self.proxy_url,
            "ANTHROPIC_API_KEY": self.session_key,
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_BUG_COMMAND": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            **(
                {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(self.max_output_tokens)}
                if self.max_output_tokens is not None
                else {}
            ),
            "CLAUDE_CODE_MAX_RETRIES": str(RETRIES),
            "API_TIMEOUT_MS": str(IDLE_TIMEOUT_MS),
        }

    def command(self, instruction: str) -> str:
        # The prompt goes after `--`: otherwise --allowedTools swallows it as a value.
        tools = f"--tools {','.join(self.LEAN_TOOLS[:4])} " if self.lean else ""
        return (
            f"{self._bin()} -p --model {shlex.quote(self.model_name or '')} "
            f"--max-turns {self.max_turns} --allowedTools 'Bash,Write,Edit,Read' {tools}"
            f"-- {shlex.quote(instruction)}"
        )


class GeminiCli(CliAgent):
    """Gemini CLI: Google generateContent at GOOGLE_GEMINI_BASE_URL, API-key auth from settings."""

    HARNESS = "gemini-cli"
    LEAN_TOOLS = ("run_shell_command", "write_file", "replace", "read_file")
    TURN_LIMIT_EXIT = (53, "Reached max session turns for this session.")

    def cli_env(self) -> dict[str, str]:
        return {
            "GEMINI_API_KEY": self.session_key,
            "GOOGLE_GEMINI_BASE_URL": self.proxy_url,
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "GEMINI_TELEMETRY_ENABLED": "false",
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
        }

    def config_files(self) -> dict[str, str]:
        # It asks for no output limit of its own, so the proxy's cap applies (8,192 tokens on a
        # 32k engine): a CPU engine decoding that much takes a quarter of an hour.
        settings: dict[str, Any] = {
            **_SETTINGS_OFF,
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "model": {"maxSessionTurns": self.max_turns},
        }
        if self.max_output_tokens is not None:
            limit = {
                "match": {"model": self.model_name},
                "modelConfig": {"generateContentConfig": {"maxOutputTokens": self.max_output_tokens}},
            }
            settings["modelConfigs"] = {"customOverrides": [limit]}
        settings["general"] = {**settings["general"], "maxAttempts": RETRIES + 1}
        if self.lean:  # its `tools.core` allowlist
            settings["tools"] = {"core": list(self.LEAN_TOOLS)}
        return {".gemini/settings.json": json.dumps(settings)}

    def command(self, instruction: str) -> str:
        return f"{self._bin()} --yolo -m {shlex.quote(self.model_name or '')} -p {shlex.quote(instruction)}"


class OpencodeCli(CliAgent):
    """opencode: chat completions through an `@ai-sdk/openai-compatible` provider in its config."""

    HARNESS = "opencode"
    LEAN_TOOLS = ("bash", "edit", "write", "read")
    ALL_TOOLS = ("bash", "edit", "glob", "grep", "read", "skill", "task", "todowrite", "webfetch", "write")

    def cli_env(self) -> dict[str, str]:
        return {
            "OPENCODE_CONFIG": f"{AGENT_HOME}/opencode.json",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_AUTOCOMPACT": "1",
            "TAPDECK_SESSION_KEY": self.session_key,
        }

    def config_files(self) -> dict[str, str]:
        model = self.model_name or ""
        # Its config needs an output figure beside the context: 0 is "not known", and it then asks
        # for its own default (32,000, capped by the proxy to what the engine takes).
        output = self.max_output_tokens if self.max_output_tokens is not None else 0
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "tapdeck": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "tapdeck",
                    # Substituted by opencode at load time: the key stays out of the file.
                    "options": {"baseURL": self.proxy_url, "apiKey": "{env:TAPDECK_SESSION_KEY}"},
                    "models": {
                        model: {
                            "name": model,
                            "tool_call": True,
                            "limit": {"context": self.context_tokens, "output": output},
                        }
                    },
                }
            },
            "model": f"tapdeck/{model}",
            "small_model": f"tapdeck/{model}",
            "autoupdate": False,
            "share": "disabled",
            "permission": {"bash": "allow", "edit": "allow"},
            "agent": {"build": {"steps": self.max_turns}},
        }
        if self.lean:  # its `tools` map turns a built-in tool off
            config["tools"] = {t: False for t in self.ALL_TOOLS if t not in self.LEAN_TOOLS}
        return {"opencode.json": json.dumps(config)}

    def command(self, instruction: str) -> str:
        return (
            f"{self._bin()} run -m {shlex.quote('tapdeck/' + (self.model_name or ''))} "
            f"{shlex.quote(instruction)}"
        )


class QwenCodeCli(CliAgent):
    """Qwen Code: chat completions through OPENAI_BASE_URL (its default `openai` auth type)."""

    HARNESS = "qwen-code"
    LEAN_TOOLS = ("run_shell_command", "edit", "write_file", "read_file")
    TURN_LIMIT_EXIT = (53, "Reached max session turns for this session.")
    ALL_TOOLS = (
        "agent",
        "edit",
        "enter_worktree",
        "exit_worktree",
        "get_goal",
        "glob",
        "grep_search",
        "list_agents",
        "notebook_edit",
        "read_file",
        "record_artifact",
        "report_findings",
        "run_shell_command",
        "send_message",
        "skill",
        "task_stop",
        "tool_call",
        "tool_search",
        "update_goal",
        "write_file",
    )
    """Its built-in tools, the deferred ones included (they come inline once tool search is off)."""

    def cli_env(self) -> dict[str, str]:
        # No relaunch: under Node 20 it starts itself again as a second node process (for a
        # larger heap), 1.5-2 s more before its first call on every run, measured here.
        return {
            "OPENAI_API_KEY": self.session_key,
            "OPENAI_BASE_URL": self.proxy_url,
            "OPENAI_MODEL": self.model_name or "",
            "QWEN_CODE_NO_RELAUNCH": "true",
        }

    def config_files(self) -> dict[str, str]:
        # The idle guard is off: a CPU engine prefilling 16k tokens is silent for a long while.
        # Its own default asks for 32,000 output tokens (the proxy then caps it at 8,192 on a 32k
        # engine): a quarter of an hour of CPU decoding per call.
        # maxRetries is its OpenAI client's retries, under its own loop of 7 attempts per call
        # (1.5 s to 30 s apart, fixed in the CLI): any retry here only doubles the 5xx requests.
        generation: dict[str, Any] = {"maxRetries": 0, "streamIdleTimeoutMs": 0, "timeout": IDLE_TIMEOUT_MS}
        if self.max_output_tokens is not None:
            generation["samplingParams"] = {"max_tokens": self.max_output_tokens}
        # Its managed memory runs a sub-agent after each finished turn (another system prompt and
        # tool set, extracting "memories" from the task's conversation), and its "dream" folds them
        # later: calls outside the task's conversation, a second root in the capture.
        memory = {"enableManagedAutoMemory": False, "enableManagedAutoDream": False}
        settings = {
            **_SETTINGS_OFF,
            "security": {"auth": {"selectedType": "openai"}},
            "model": {"maxSessionTurns": self.max_turns, "generationConfig": generation},
            "memory": memory,
        }
        if self.lean:
            # `tools.core` is its allowlist; its built-in agent, goal and tool-search tools bypass
            # that by design and leave only through `tools.disabled`.
            settings["tools"] = {
                "core": list(self.LEAN_TOOLS),
                "disabled": [t for t in self.ALL_TOOLS if t not in self.LEAN_TOOLS],
            }
        return {".qwen/settings.json": json.dumps(settings)}

    def command(self, instruction: str) -> str:
        return f"{self._bin()} --yolo {shlex.quote(instruction)}"


class MiniSweAgentCli(CliAgent):
    """mini-swe-agent: chat completions through LiteLLM (`openai/<served>`), not streamed."""

    HARNESS = "mini-swe-agent"

    def cli_env(self) -> dict[str, str]:
        # A plain traceback when it exits on an error: Typer's rich one took 6 s to render here.
        return {
            "OPENAI_API_KEY": self.session_key,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(RETRIES + 1),
            "TYPER_STANDARD_TRACEBACK": "1",
        }

    def command(self, instruction: str) -> str:
        # max_retries=0: the OpenAI client's own 2 retries under each of its attempts made 3
        # requests of every one; its attempts alone give RETRIES.
        config = [
            f"model.model_kwargs.api_base={self.proxy_url}",
            "model.model_kwargs.max_retries=0",
            *(
                [f"model.model_kwargs.max_tokens={self.max_output_tokens}"]
                if self.max_output_tokens is not None
                else []
            ),
            f"agent.step_limit={self.max_turns}",
        ]
        flags = " ".join(f"-c {shlex.quote(c)}" for c in config)
        return (
            f"{self._bin()} -y --exit-immediately -l 0 "
            f"-m {shlex.quote('openai/' + (self.model_name or ''))} -c mini.yaml {flags} "
            f"-o /logs/agent/mini.traj.json -t {shlex.quote(instruction)}"
        )


CLI_AGENTS: dict[str, type[CliAgent]] = {
    cls.HARNESS: cls
    for cls in (CodexCli, ClaudeCodeCli, GeminiCli, OpencodeCli, QwenCodeCli, MiniSweAgentCli)
}
