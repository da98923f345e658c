"""What tapdeck adds to Harbor's own docker environment (`--sandbox docker`); Harbor's code builds,
starts, execs in and stops the container.

- A compose overlay (Harbor's `extra_docker_compose`) labels the task's `main` container with its
  owner (this process: boot id, pid and start time), so a later process can tell the containers
  of a dead tapdeck from a live one's (`abandoned_containers`), and sets its network (`NETWORKS`,
  the sandbox option `network`). By default an agent CLI's container, whose agent calls the
  capture proxy on this host's loopback, gets no network at all: the proxy's port is relayed in
  (`relayed_docker`), so the agent reaches the proxy at the same loopback address and nothing
  else. A container whose agent runs on the host (terminus-2, the oracle) never calls the proxy,
  and keeps Harbor's own network: compose's bridge for the run, none where the task asks for none.
- Agent CLIs that tapdeck installs on the host (`cli_agents`) run from that install: its folder is
  bind-mounted read-only at the same path, and so is the host's `node` (the Node CLIs' launcher)
  at /usr/local/bin/node. Harbor's own installed agents download their CLI inside the container
  at setup, which needs the internet; the mount needs nothing and starts at once.
- `check` says whether the backend is ready, and what is missing where it is not, for `tapdeck
  info` (`scripts/container-sandbox.sh` readies it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tapdeck.runner import harbor_api

OWNER_LABEL = "tapdeck.owner"
"""The label naming the process that started a container (`owner()`)."""
NODE_IN_CONTAINER = "/usr/local/bin/node"
SETUP_SCRIPT = "scripts/container-sandbox.sh"
_CHECK_TIMEOUT_S = 10.0


def _start_ticks(pid: int) -> str | None:
    """A process's start time since boot (clock ticks; field 22 of /proc/PID/stat)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def boot_id() -> str:
    """This boot of this machine (a pid means nothing across boots or machines)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def owner(pid: int | None = None) -> str:
    """`BOOT:PID:START` of a process (this one by default): unique while it lives, never reused."""
    pid = os.getpid() if pid is None else pid
    return f"{boot_id()}:{pid}:{_start_ticks(pid)}"


def owner_alive(label: str) -> bool:
    """Whether the process an owner label names still runs (a label of another boot or machine
    counts as alive: it is not ours to judge)."""
    try:
        boot, pid, start = label.split(":")
    except ValueError:
        return True
    if boot != boot_id():
        return True
    return pid.isdigit() and _start_ticks(int(pid)) == start


def state_dir() -> Path:
    """Where the overlays are written: `$TAPDECK_CONTAINER_CACHE`, else ~/.cache/tapdeck/container."""
    return Path(os.environ.get("TAPDECK_CONTAINER_CACHE") or Path.home() / ".cache/tapdeck/container")


NETWORKS = {
    "auto": "none for an agent CLI whose proxy is on this host's loopback, else bridge",
    "none": "no network; the capture proxy's loopback port relayed in, nothing else reachable",
    "host": "the host's network: every address the host reaches, its loopback included",
    "bridge": "Harbor's own: compose's bridge network for the run (none where the task asks for none)",
}
"""The docker sandbox's `network` option: each choice and what the container can reach."""
RELAYED_IMPORT_PATH = "tapdeck.runner.sandboxes.relayed_docker:RelayedDockerEnvironment"


def network_mode(choice: str, *, agent_in_container: bool, proxy_port: int | None) -> str:
    """The network a container gets (`none`, `host` or `bridge`) for the `network` option's `choice`:
    `auto` cuts an agent CLI's container off but for the proxy, when the proxy is on this host's
    loopback (`proxy_port`), and leaves any other container on Harbor's own network."""
    if choice not in NETWORKS:
        raise ValueError(f"the docker sandbox's network must be one of {', '.join(NETWORKS)}, not {choice!r}")
    if choice != "auto":
        return choice
    return "none" if agent_in_container and proxy_port is not None else "bridge"


def overlay(network: str) -> Path:
    """The compose overlay of this process's containers on `network` (written once per process
    and network)."""
    main: dict[str, Any] = {"labels": {OWNER_LABEL: owner()}}
    if network in ("host", "none"):
        main["network_mode"] = network
    path = state_dir() / "overlays" / f"{owner().replace(':', '-')}-{network}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.new")
        scratch.write_text(json.dumps({"services": {"main": main}}, indent=2))
        scratch.replace(path)
    return path


def agent_mounts(harness: str, agents_dir: Path | None = None) -> list[dict[str, Any]]:
    """Read-only bind mounts that let a host-installed agent CLI run in the container: its install
    folder at the same path, and the host's node for the Node CLIs. None for other harnesses or
    an agent not installed yet (its setup then says so)."""
    from tapdeck.runner import agent_install

    if harness not in agent_install.PACKAGES:
        return []
    record = agent_install.installed(harness, agents_dir)
    if record is None:
        return []
    mounts = [{"type": "bind", "source": record.path, "target": record.path, "read_only": True}]
    node = shutil.which("node")
    if agent_install.get_package(harness).registry == "npm" and node is not None:
        mounts.append(
            {"type": "bind", "source": os.path.realpath(node), "target": NODE_IN_CONTAINER, "read_only": True}
        )
    return mounts


def environment_config(
    *,
    harness: str,
    network: str,
    proxy_port: int | None,
    kwargs: dict[str, Any] | None = None,
    agents_dir: Path | None = None,
) -> Any:
    """Harbor's `EnvironmentConfig` for its docker environment (as `RelayedDockerEnvironment`), with
    tapdeck's overlay and mounts, on `network` (`network_mode`); on `none`, `proxy_port` of this
    host's loopback is relayed in."""
    kwargs = dict(kwargs or {})
    if network == "none" and proxy_port is not None:
        kwargs["loopback_ports"] = [proxy_port]
    return harbor_api.EnvironmentConfig(
        type=harbor_api.EnvironmentType.DOCKER,
        import_path=RELAYED_IMPORT_PATH,
        mounts=agent_mounts(harness, agents_dir) or None,
        extra_docker_compose=[overlay(network)],
        kwargs=kwargs,
    )


_COMPOSE_FAILED = re.compile(
    r"Docker compose command failed for environment \S+\. Command: (?P<command>.*?)\. "
    r"Return code: (?P<code>-?\d+)\. Stdout: (?P<out>.*)\. Stderr: (?P<err>.*)\.",
    re.DOTALL,
)
"""The message of the RuntimeError Harbor's docker environment raises when a compose command fails."""
_CAUSE = re.compile(r"error|failed|denied|not found|no such|cannot|unable|invalid", re.IGNORECASE)


def compose_failure(message: str) -> str | None:
    """One line saying why a compose command of Harbor's docker environment failed: the command
    (`build`, `up …`) and the last line of its output that reads as a cause (the build step that
    failed, an image that could not be found), not the whole command line Harbor's message starts
    with. None for any other message."""
    found = _COMPOSE_FAILED.search(message)
    if found is None:
        return None
    words = found["command"].split()
    last_file = max((i for i, w in enumerate(words) if w == "-f"), default=-2)
    command = " ".join(words[last_file + 2 :]) or "command"
    lines = [
        line.strip()
        for line in f"{found['out']}\n{found['err']}".splitlines()
        if line.strip() and line.strip() != "None"
    ]
    cause = ([line for line in lines if _CAUSE.search(line)] or lines or ["no output"])[-1]
    return f"docker compose {command} failed (exit {found['code']}): {cause}"


def sample_task_images() -> list[str]:
    """The images the shipped sample tasks' Dockerfiles start `FROM`."""
    from tapdeck.runner.datasets import SAMPLE_DATASET_DIR

    images = set()
    for dockerfile in sorted(SAMPLE_DATASET_DIR.glob("*/environment/Dockerfile")):
        for line in dockerfile.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0].upper() == "FROM":
                images.add(words[1])
    return sorted(images)


def _run(*argv: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_CHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def check() -> tuple[bool, str]:
    """Whether Harbor's docker sandbox can run the sample tasks here: the docker CLI, a daemon
    that answers, the Compose v2 plugin, and the base images the sample tasks name (no registry
    is asked for them). `(ok, why)`; never raises."""
    fix = f"run {SETUP_SCRIPT} as root to ready it"
    if shutil.which("docker") is None:
        return False, f"no docker CLI on PATH; {fix}"
    info = _run("docker", "info", "--format", "{{.ServerVersion}}")
    if info is None or info.returncode != 0:
        return False, f"Docker daemon is not running (docker info failed); {fix}"
    compose = _run("docker", "compose", "version", "--short")
    if compose is None or compose.returncode != 0:
        return False, f"dockerd {info.stdout.strip()} runs, but no `docker compose` v2 plugin; {fix}"
    missing = [
        image
        for image in sample_task_images()
        if (found := _run("docker", "image", "inspect", image)) is None or found.returncode != 0
    ]
    versions = f"dockerd {info.stdout.strip()}, compose {compose.stdout.strip()}"
    if missing:
        return False, (
            f"{versions}; the sample tasks' base image(s) {', '.join(missing)} are not built here "
            f"(no registry is reached); {fix}"
        )
    return True, f"available: {versions}; the sample tasks' base images are built"


__all__ = [
    "NETWORKS",
    "OWNER_LABEL",
    "agent_mounts",
    "check",
    "compose_failure",
    "environment_config",
    "network_mode",
    "overlay",
    "owner",
    "owner_alive",
    "sample_task_images",
]
