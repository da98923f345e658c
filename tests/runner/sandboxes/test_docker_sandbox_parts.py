"""The parts of the docker sandbox that need no daemon: owner labels, the compose overlay, the
agent mounts, and the one-line cause of a failed compose command."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tapdeck.runner.sandboxes import docker_sandbox

# The shape of Harbor's message for a failed `docker compose build` (recorded here, paths cut).
BUILD_FAILED = (
    "Docker compose command failed for environment broken-image. Command: docker compose "
    "--project-name run-1-g000r00__env --project-directory /t/broken-image/environment -f "
    "/h/docker-compose-build.yaml -f /c/overlays/x.json build. Return code: 17. Stdout: #0 building "
    'with "default" instance using docker driver\n\n#5 [main 2/2] RUN exit 7\n'
    "#5 ERROR: executor failed running [/bin/sh -c exit 7]: exit code: 7\n------\n"
    "failed to solve: executor failed running [/bin/sh -c exit 7]: exit code: 7\n. Stderr: None. "
)


def test_a_failed_compose_command_is_said_by_its_command_and_cause() -> None:
    assert docker_sandbox.compose_failure(BUILD_FAILED) == (
        "docker compose build failed (exit 17): failed to solve: executor failed running "
        "[/bin/sh -c exit 7]: exit code: 7"
    )
    assert docker_sandbox.compose_failure("RuntimeError: something else") is None


def test_an_owner_is_alive_while_its_process_runs() -> None:
    me = docker_sandbox.owner()
    assert me.split(":")[1] == str(os.getpid()) and docker_sandbox.owner_alive(me)
    child = subprocess.Popen(["sleep", "30"])
    label = docker_sandbox.owner(child.pid)
    assert docker_sandbox.owner_alive(label)
    child.kill()
    child.wait()
    assert not docker_sandbox.owner_alive(label)
    # A pid reused by a later process is not the owner: its start time differs.
    boot, pid, start = label.split(":")
    assert not docker_sandbox.owner_alive(f"{boot}:{os.getpid()}:{start}")
    # Another boot's (or machine's) containers are not ours to judge.
    assert docker_sandbox.owner_alive(f"another-boot:{pid}:{start}")


def test_the_overlay_labels_main_with_its_owner_and_sets_its_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAPDECK_CONTAINER_CACHE", str(tmp_path))
    labels = {"tapdeck.owner": docker_sandbox.owner()}
    for network in ("host", "none"):
        main = json.loads(docker_sandbox.overlay(network).read_text())["services"]["main"]
        assert main == {"labels": labels, "network_mode": network}
    bridge = json.loads(docker_sandbox.overlay("bridge").read_text())
    assert bridge == {"services": {"main": {"labels": labels}}}


def test_auto_cuts_an_agent_clis_container_off_but_for_a_loopback_proxy() -> None:
    def mode(choice: str, agent_in_container: bool, port: int | None) -> str:
        return docker_sandbox.network_mode(choice, agent_in_container=agent_in_container, proxy_port=port)

    assert mode("auto", True, 8123) == "none"
    # terminus-2 and the oracle never call the proxy from inside: Harbor's own network.
    assert mode("auto", False, 8123) == "bridge"
    # A proxy elsewhere (a public URL) is reached over a network, not relayed.
    assert mode("auto", True, None) == "bridge"
    assert [mode(c, True, 8123) for c in ("host", "none", "bridge")] == ["host", "none", "bridge"]
    with pytest.raises(ValueError, match="one of auto, none, host, bridge, not 'public'"):
        mode("public", True, 8123)


def test_the_environment_relays_the_proxy_port_only_into_a_container_without_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAPDECK_CONTAINER_CACHE", str(tmp_path))
    cut = docker_sandbox.environment_config(harness="oracle", network="none", proxy_port=8123)
    assert cut.import_path == docker_sandbox.RELAYED_IMPORT_PATH and cut.kwargs == {"loopback_ports": [8123]}
    bridged = docker_sandbox.environment_config(harness="oracle", network="bridge", proxy_port=8123)
    assert bridged.kwargs == {} and bridged.extra_docker_compose[0].name.endswith("-bridge.json")


def test_an_installed_node_cli_is_mounted_read_only_with_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tapdeck.runner import agent_install

    package = agent_install.get_package("codex")
    folder = agent_install.install_dir(package, tmp_path)
    (folder / package.entry).parent.mkdir(parents=True)
    (folder / package.entry).write_text("#!/usr/bin/env node\n")
    record = {
        "name": "codex",
        "package": package.package,
        "version": package.version,
        "registry": package.registry,
        "path": str(folder),
        "entry": package.entry,
        "size_bytes": 1,
        "install_seconds": 0.0,
        "installed_at": 0.0,
    }
    (folder / agent_install.RECORD).write_text(json.dumps(record))
    node = tmp_path / "bin" / "node"
    node.parent.mkdir()
    node.write_text("")
    node.chmod(0o755)
    monkeypatch.setenv("PATH", str(node.parent))
    assert docker_sandbox.agent_mounts("codex", tmp_path) == [
        {"type": "bind", "source": str(folder), "target": str(folder), "read_only": True},
        {"type": "bind", "source": str(node), "target": "/usr/local/bin/node", "read_only": True},
    ]
    assert docker_sandbox.agent_mounts("claude-code", tmp_path) == []  # not installed there
    assert docker_sandbox.agent_mounts("terminus-2", tmp_path) == []


def test_the_check_names_what_is_missing_and_the_script_that_readies_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert docker_sandbox.check() == (
        False,
        "no docker CLI on PATH; run scripts/container-sandbox.sh as root to ready it",
    )
    # A docker CLI whose daemon answers, with no compose plugin, then one without the base image.
    docker = tmp_path / "docker"
    docker.write_text(
        "#!/bin/sh\n"
        'case "$1" in info) echo 20.10.24;; compose) [ -f "$0.compose" ] && echo 2.29.7 || exit 1;; '
        "image) exit 1;; esac\n"
    )
    docker.chmod(0o755)
    ok, why = docker_sandbox.check()
    assert not ok and why.startswith("dockerd 20.10.24 runs, but no `docker compose` v2 plugin; run scripts/")
    (tmp_path / "docker.compose").write_text("")
    ok, why = docker_sandbox.check()
    assert not ok and "base image(s) python:3.12-slim-bookworm are not built here" in why, why


def test_the_relayed_environment_mounts_the_relay_only_where_ports_are_relayed(tmp_path: Path) -> None:
    """Harbor's docker environment as tapdeck makes it: with loopback ports, the trial's relay/
    folder and the relay script (read-only) are mounted where the inner relay finds them; without,
    nothing is added. No daemon is asked: only the constructor runs."""
    from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    from tapdeck.runner.sandboxes import loopback_relay
    from tapdeck.runner.sandboxes.relayed_docker import RELAY_DIR, RELAY_SCRIPT, RelayedDockerEnvironment

    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "Dockerfile").write_text("FROM scratch\n")

    def made(ports: list[int] | None) -> RelayedDockerEnvironment:
        return RelayedDockerEnvironment(
            environment_dir=tmp_path / "env",
            environment_name="t",
            session_id="s",
            trial_paths=TrialPaths(tmp_path / "trial"),
            task_env_config=TaskEnvironmentConfig(),
            loopback_ports=ports,
        )

    relayed = made([8123])
    mounts = {m["target"]: (m["source"], m.get("read_only", False)) for m in relayed._host_mounts}
    assert mounts == {
        RELAY_DIR: (str(tmp_path / "trial" / "relay"), False),
        RELAY_SCRIPT: (str(Path(loopback_relay.__file__).resolve()), True),
    }
    assert (tmp_path / "trial" / "relay").is_dir() and relayed.type().value == "docker"
    assert made(None)._host_mounts == []
