"""The runner's one error family: every refusal a runner route answers with, and its HTTP status.

Each error that reaches an admin route derives from `RunnerError` and carries its `status`;
`runner/api.py` renders the whole family with one exception handler, in the admin API's error
shape (`proxy/http/error_reply.py`). The runner's inner errors (a dataset that does not load, an
engine choice, rollout settings that do not fit) become one of these where the runner decides what
they mean for a run. A situation that answers with another status has a class of its own: a plan
refused when a run is made is a 400, the same refusal when a stored run is resumed a 409.
"""

from __future__ import annotations

from typing import ClassVar


class RunnerError(Exception):
    """A refusal a runner route answers with: `status` (HTTP) and `message` (what happened and
    what to do, for a person)."""

    status: ClassVar[int]
    """Set by each subclass: the status its situation is answered with."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ----------------------------------------------------------------- runs


class PlanError(RunnerError):
    """A plan that cannot run (unknown dataset/task/harness/sandbox, bad engine)."""

    status = 400


class DatasetUnreachable(PlanError):
    """A plan whose dataset's source (Harbor's registry, a git host) did not answer: the plan may
    be fine, the run could not be made now (bad gateway: what did not answer is the source)."""

    status = 502


class RunNotStartable(PlanError):
    """A stored run that cannot start (or resume) as it stands: it runs already, results of it
    cannot be read, or this server cannot call the engine its rollouts called. A conflict with the
    run, not a bad plan."""

    status = 409


class RunElsewhere(PlanError):
    """A run another process on this data dir runs now: starting it here would run its rollouts
    twice, and only that process can cancel them. The message names that process."""

    status = 409

    def __init__(self, run_id: str, pid: int) -> None:
        who = f"process {pid}" if pid else "another process"
        super().__init__(
            f"run {run_id} is running in {who} on this data dir; follow it on that "
            "process's server (--server), or resume it once that process has ended"
        )
        self.pid = pid


class RunUnreadable(PlanError):
    """A run whose plan.json cannot be read back (corrupt, truncated, another shape); the message
    names the file and what is wrong with it."""

    status = 409


class RunNotFound(RunnerError):
    """No run with that id in this data dir."""

    status = 404

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id}")
        self.run_id = run_id


class RolloutNotFound(RunnerError):
    """A run that has no rollout of that id."""

    status = 404

    def __init__(self, run_id: str, rollout_id: str) -> None:
        super().__init__(f"run {run_id} has no rollout {rollout_id}")


class RolloutNotRunning(RunnerError):
    """A rollout that cannot be cancelled alone: it has not started, or it has ended."""

    status = 409

    def __init__(self, rollout_id: str) -> None:
        super().__init__(f"rollout {rollout_id} is not running")


# ----------------------------------------------------------------- training runs


class TrainRefused(RunnerError):
    """A launch that cannot start (unknown recipe, missing run, no training environment)."""

    status = 400


class TrainUsage(TrainRefused):
    """A launch whose recipe args its own argument parser refuses: bad usage."""

    status = 422


class TrainElsewhere(RunnerError):
    """A training run another server process launched: only that process can stop it."""

    status = 409


class TrainNotFound(RunnerError):
    """No training run with that id in this data dir."""

    status = 404

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no training run {run_id}")
        self.run_id = run_id


__all__ = [
    "DatasetUnreachable",
    "PlanError",
    "RolloutNotFound",
    "RolloutNotRunning",
    "RunElsewhere",
    "RunNotFound",
    "RunNotStartable",
    "RunUnreadable",
    "RunnerError",
    "SandboxExecFailed",
    "SandboxExecTimedOut",
    "SandboxUnavailable",
    "TrainElsewhere",
    "TrainNotFound",
    "TrainRefused",
    "TrainUsage",
]


# ----------------------------------------------------------------- replays


class ReplayRefused(RunnerError):
    """A replay that cannot be made against this reference engine (its tokenizer differs, it gives
    no prompt logprobs, it serves no such model, or `embedded` on a server without one)."""

    status = 400


class SessionNotReplayable(ReplayRefused):
    """A session whose capture has nothing to score (no token ids: the eval tier), or none at all."""

    status = 409


class ReferenceUnreachable(ReplayRefused):
    """The reference engine did not answer, or answered with an error of its own."""

    status = 502


# ----------------------------------------------------------------- inside a rollout's sandbox


class SandboxUnavailable(RunnerError):
    """A rollout whose sandbox cannot be reached now: it has not started its agent yet, or it has
    ended (its sandbox is gone). The message says which."""

    status = 409


class SandboxExecFailed(RunnerError):
    """A command the sandbox could not run (its environment's `exec` raised), or a look inside it
    (`ps`) that failed there."""

    status = 502


class SandboxExecTimedOut(RunnerError):
    """A command that ran past its time limit in the sandbox and was killed."""

    status = 504
