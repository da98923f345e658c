"""Removal of the docker sandbox containers a dead tapdeck process left running.

Harbor stops a trial's compose project when the trial ends or is cancelled, but a `kill -9` (or a
crash) of the process running it leaves the container up (`sleep infinity`). Each container of a
tapdeck trial carries its owner's label (`docker_sandbox.owner`: boot id, pid, start time); a
container whose owner no longer runs is abandoned, and its whole compose project (the task's other
services and networks too) is removed. A server sweeps at start, and each docker rollout before
its trial starts, so whichever comes next after a crash leaves nothing of it running.
"""

from __future__ import annotations

import logging
import shutil
import subprocess

from tapdeck.runner.sandboxes.docker_sandbox import OWNER_LABEL, owner_alive

log = logging.getLogger("tapdeck.runner")
_TIMEOUT_S = 60.0
PROJECT_LABEL = "com.docker.compose.project"


def _docker(*argv: str) -> str | None:
    """A docker command's stdout, or None when it could not run or failed."""
    try:
        done = subprocess.run(
            ["docker", *argv], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def abandoned_projects() -> list[str]:
    """The compose projects holding a tapdeck container whose owner process is gone."""
    listing = _docker(
        "ps",
        "--all",
        "--filter",
        f"label={OWNER_LABEL}",
        "--format",
        f'{{{{.Label "{OWNER_LABEL}"}}}}\t{{{{.Label "{PROJECT_LABEL}"}}}}',
    )
    projects = set()
    for line in (listing or "").splitlines():
        label, _, project = line.partition("\t")
        if project and not owner_alive(label):
            projects.add(project)
    return sorted(projects)


def remove_abandoned() -> list[str]:
    """Remove every abandoned project's containers and networks; returns the projects removed.
    Does nothing (quickly) where there is no docker CLI or daemon."""
    if shutil.which("docker") is None:
        return []
    removed = []
    for project in abandoned_projects():
        of_project = f"label={PROJECT_LABEL}={project}"
        containers = (_docker("ps", "--all", "--quiet", "--filter", of_project) or "").split()
        if containers and _docker("rm", "--force", "--volumes", *containers) is None:
            log.warning("could not remove the containers of abandoned docker sandbox %s", project)
            continue
        networks = (_docker("network", "ls", "--quiet", "--filter", of_project) or "").split()
        if networks:
            _docker("network", "rm", *networks)
        removed.append(project)
    if removed:
        log.info("removed docker sandboxes a dead tapdeck left running: %s", ", ".join(removed))
    return removed


__all__ = ["abandoned_projects", "remove_abandoned"]
