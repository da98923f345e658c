"""Harbor, as the runner reaches it: the one module of tapdeck that imports Harbor's packages.

Each Harbor name the runner uses is listed in `NAMES` and imported from Harbor when it is used
(`harbor_api.Trial`), never when this module is: processes that import the runner and run no
trial (the CLI's listings, a server before its first run) do not pay Harbor's imports (1 to 3 s),
and listing a dataset imports only the part of Harbor that does it. Nothing is cached here, so a
test that patches a Harbor module's attribute is seen. The modules whose classes subclass
Harbor's (`cli_agents`, `sandboxes/host`, `sandboxes/relayed_docker`) import their names at their
top instead (`from tapdeck.runner.harbor_api import BaseEnvironment`): they load only where a
trial runs.

Harbor's agents import litellm, which fetches its model cost map over the network as it is
imported unless LITELLM_LOCAL_MODEL_COST_MAP says to use the map it ships: a stall offline. That
switch is set as this module is imported, so it holds before any Harbor import, for litellm's
other importers in the process (the rollout command's log routing) and for the processes the
runner starts.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

if TYPE_CHECKING:  # the same names, for type checkers and readers (`NAMES` is what runs)
    from harbor.agents.base import BaseAgent
    from harbor.agents.installed.base import NonZeroAgentExitCodeError
    from harbor.environments.base import BaseEnvironment, ExecResult, OutputCallback
    from harbor.environments.capabilities import EnvironmentCapabilities
    from harbor.environments.docker.docker import DockerEnvironment
    from harbor.environments.factory import EnvironmentFactory
    from harbor.environments.factory import _load_environment_class as load_environment_class
    from harbor.models.agent.context import AgentContext
    from harbor.models.environment_type import EnvironmentType
    from harbor.models.job.config import DatasetConfig
    from harbor.models.task.config import NetworkMode, TaskConfig
    from harbor.models.task.task import Task
    from harbor.models.trajectories import Trajectory
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TrialConfig
    from harbor.models.trial.config import TaskConfig as TrialTaskConfig
    from harbor.models.trial.result import TrialResult
    from harbor.tasks.client import TaskClient
    from harbor.trial.hooks import TrialEvent
    from harbor.trial.trial import Trial

NAMES: dict[str, str] = {
    # agents
    "AgentContext": "harbor.models.agent.context:AgentContext",
    "AgentConfig": "harbor.models.trial.config:AgentConfig",
    "BaseAgent": "harbor.agents.base:BaseAgent",
    "NonZeroAgentExitCodeError": "harbor.agents.installed.base:NonZeroAgentExitCodeError",
    # environments (sandboxes)
    "BaseEnvironment": "harbor.environments.base:BaseEnvironment",
    "DockerEnvironment": "harbor.environments.docker.docker:DockerEnvironment",
    "EnvironmentCapabilities": "harbor.environments.capabilities:EnvironmentCapabilities",
    "EnvironmentConfig": "harbor.models.trial.config:EnvironmentConfig",
    "EnvironmentFactory": "harbor.environments.factory:EnvironmentFactory",
    "EnvironmentType": "harbor.models.environment_type:EnvironmentType",
    "ExecResult": "harbor.environments.base:ExecResult",
    # Private in Harbor: the one way to import an environment class without making one.
    "load_environment_class": "harbor.environments.factory:_load_environment_class",
    "NetworkMode": "harbor.models.task.config:NetworkMode",
    "OutputCallback": "harbor.environments.base:OutputCallback",
    # tasks and datasets
    "DatasetConfig": "harbor.models.job.config:DatasetConfig",
    "Task": "harbor.models.task.task:Task",
    "TaskClient": "harbor.tasks.client:TaskClient",
    "TaskConfig": "harbor.models.task.config:TaskConfig",
    # trials
    "Trajectory": "harbor.models.trajectories:Trajectory",
    "Trial": "harbor.trial.trial:Trial",
    "TrialConfig": "harbor.models.trial.config:TrialConfig",
    "TrialEvent": "harbor.trial.hooks:TrialEvent",
    "TrialResult": "harbor.models.trial.result:TrialResult",
    # A trial's task (path or registry name), not a task's own task.toml config (`TaskConfig`).
    "TrialTaskConfig": "harbor.models.trial.config:TaskConfig",
}
"""Each Harbor name the runner uses: its `module:attribute` in Harbor."""


def __getattr__(name: str) -> Any:
    """The Harbor object `NAMES` lists under `name`, imported now (PEP 562)."""
    where = NAMES.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = where.split(":")
    return getattr(importlib.import_module(module), attribute)


__all__ = sorted(NAMES)
