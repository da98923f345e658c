"""Pinned agent installs: records, idempotence, the qwen exec-bit fix, and a clear network error."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tapdeck.runner import agent_install
from tests.support.processes import process_gone


def _fake_install(root: Path, name: str, version: str | None = None) -> Path:
    """A folder laid out as a finished install of `name` (entry present, record written)."""
    package = agent_install.get_package(name)
    folder = agent_install.install_dir(package, root)
    entry = folder / package.entry
    entry.parent.mkdir(parents=True)
    entry.write_text("#!/bin/sh\n")
    record = agent_install.InstallRecord(
        name=name,
        package=package.package,
        version=version or package.version,
        registry=package.registry,
        path=str(folder),
        entry=package.entry,
        size_bytes=10,
        install_seconds=1.0,
        installed_at=0.0,
    )
    (folder / agent_install.RECORD).write_text(record.model_dump_json())
    return folder


def test_every_seed_agent_is_pinned_with_its_registry() -> None:
    pinned = {name: (p.registry, p.spec) for name, p in agent_install.PACKAGES.items()}
    assert pinned == {
        "codex": ("npm", "@openai/codex@0.169.0"),
        "claude-code": ("npm", "@anthropic-ai/claude-code@2.1.328"),
        "gemini-cli": ("npm", "@google/gemini-cli@0.61.0"),
        "opencode": ("npm", "opencode-ai@1.18.33"),
        "qwen-code": ("npm", "@qwen-code/qwen-code@0.24.4"),
        "mini-swe-agent": ("pypi", "mini-swe-agent==2.4.6"),
    }


def test_install_of_an_installed_agent_does_nothing_and_returns_its_record(tmp_path: Path) -> None:
    folder = _fake_install(tmp_path, "codex")
    said: list[str] = []
    record = agent_install.install("codex", root=tmp_path, on_progress=said.append)
    assert record.path == str(folder) and record.version == "0.169.0"
    assert said == [f"codex 0.169.0 already installed at {folder}"]
    assert agent_install.installed_all(tmp_path) == {"codex": record}
    assert agent_install.entry_path("codex", tmp_path) == folder / "node_modules/.bin/codex"


def test_a_folder_without_its_record_or_at_another_version_is_not_installed(tmp_path: Path) -> None:
    folder = _fake_install(tmp_path, "opencode")
    (folder / agent_install.RECORD).unlink()
    assert agent_install.installed("opencode", tmp_path) is None
    shutil.rmtree(folder)
    _fake_install(tmp_path, "opencode", version="0.0.1")
    assert agent_install.installed("opencode", tmp_path) is None


def test_unknown_agent_names_the_installable_ones() -> None:
    with pytest.raises(KeyError, match="installable: codex, claude-code"):
        agent_install.get_package("goose")


def test_qwen_vendored_ripgrep_gets_its_exec_bit(tmp_path: Path) -> None:
    rg = tmp_path / "node_modules/@qwen-code/qwen-code/vendor/ripgrep/x64-linux/rg"
    rg.parent.mkdir(parents=True)
    rg.write_bytes(b"\x7fELF")
    rg.chmod(0o644)
    agent_install._fix_permissions(agent_install.get_package("qwen-code"), tmp_path)
    assert rg.stat().st_mode & stat.S_IXUSR


@pytest.mark.medium
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm (Node.js) on PATH")
def test_unreachable_registry_is_a_network_install_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens on port 9 of loopback: npm gets a refused connection, as when offline.
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    with pytest.raises(agent_install.InstallError) as caught:
        agent_install.install("gemini-cli", root=tmp_path)
    assert caught.value.network, str(caught.value)
    assert "@google/gemini-cli@0.61.0" in str(caught.value)
    assert agent_install.installed("gemini-cli", tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == [".gemini-cli.lock"]


def test_folder_size_counts_hard_links_once(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 100_000)
    os.link(tmp_path / "a", tmp_path / "b")
    one = agent_install.folder_size(tmp_path)
    (tmp_path / "c").write_bytes(b"x" * 100_000)
    assert agent_install.folder_size(tmp_path) > one >= 100_000


@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm (Node.js) on PATH")
async def test_rollout_installs_its_agent_cli_on_first_use_publishing_each_installer_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tapdeck.runner.datasets import SAMPLE_DATASET_DIR
    from tapdeck.runner.rollout import RolloutResult, RolloutSpec, run_rollout
    from tapdeck.schema.runs import RolloutTemplate

    monkeypatch.setenv(agent_install.AGENTS_DIR_ENV, str(tmp_path / "agents"))
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")  # refused: offline
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    seen: list[RolloutResult] = []
    spec = RolloutSpec(
        task="hello-file",
        task_path=SAMPLE_DATASET_DIR / "hello-file",
        trials_dir=tmp_path / "trials",
        rollout=RolloutTemplate(harness="gemini-cli"),
    )
    # The install comes before the capture session: no service is reached when it fails.
    result = await run_rollout(None, spec, on_update=seen.append)
    assert result.error_kind == "agent_install_failed", result.error
    assert "@google/gemini-cli@0.61.0" in (result.error or "")
    details = [r.detail for r in seen if r.phase == "install" and r.detail]
    assert details and details[0] == (
        f"installing @google/gemini-cli@0.61.0 from npm into {tmp_path / 'agents' / 'gemini-cli-0.61.0'}"
    )
    assert len(details) >= 2  # npm's own lines follow
    assert result.detail is None and result.phase == "failed"


def test_an_installer_that_goes_quiet_is_stopped_at_its_deadline_with_its_children() -> None:
    # A stalled download prints nothing: the deadline must not wait for a next line (waiting for
    # one, the installer ends on its own after 120 s, and no error is raised).
    import time

    argv = ["sh", "-c", "echo resolving; sleep 120 & echo $! ; wait"]
    said: list[str] = []
    with pytest.raises(agent_install.InstallError, match="took longer than allowed") as err:
        agent_install._stream(
            argv,
            dict(os.environ),
            Path("/tmp"),
            said.append,
            time.monotonic() + 1.0,
            agent_install.get_package("codex"),
        )
    child = int(said[1])
    assert process_gone(child)
    assert "its last line" in str(err.value)
