"""What the host sandbox reads of a task's environment definition (its `environment/` folder).

The host is the image: the Dockerfile is not built, only its last absolute `WORKDIR` is taken, and
a docker-compose.yaml is read for its service names (a service besides `main` cannot be started).
"""

from __future__ import annotations

import re
from pathlib import Path


def compose_services(environment_dir: Path) -> list[str]:
    """The service names of the task's `docker-compose.yaml` (none without one).

    Raises ValueError, naming the file, when it is not a compose file that can be read.
    """
    import yaml

    compose = environment_dir / "docker-compose.yaml"
    if not compose.is_file():
        return []
    try:
        services = (yaml.safe_load(compose.read_text(errors="replace")) or {}).get("services") or {}
    except (yaml.YAMLError, AttributeError) as exc:
        raise ValueError(f"{compose} is not a docker compose file that can be read: {exc}") from None
    if not isinstance(services, dict):
        raise ValueError(f"{compose}: `services` is not a mapping of service names")
    return [str(name) for name in services]


def dockerfile_workdir(environment_dir: Path) -> str | None:
    """The last absolute `WORKDIR` of the task's Dockerfile (the only thing read from it)."""
    dockerfile = environment_dir / "Dockerfile"
    if not dockerfile.is_file():
        return None
    workdir = None
    for line in dockerfile.read_text(errors="replace").splitlines():
        match = re.match(r"\s*WORKDIR\s+(\S+)\s*$", line, re.IGNORECASE)
        if match and match.group(1).startswith("/"):
            workdir = match.group(1)
    return workdir


__all__ = ["compose_services", "dockerfile_workdir"]
