"""A plan resolved before a run is made: its tasks, from its dataset, and its sandbox, checked.

`BatchRunner.create` (runner/batch.py) calls these before it writes anything, so a plan that
cannot run is refused (PlanError; DatasetUnreachable when the dataset's source did not answer)
without leaving a run behind. The plan itself is `schema.runs.RunPlan`.
"""

from __future__ import annotations

from tapdeck.runner.errors import DatasetUnreachable, PlanError
from tapdeck.schema.runs import MAX_ROLLOUTS, RunPlan


def resolve_tasks(plan: RunPlan) -> tuple[list[dict[str, str]], list[str]]:
    """The plan's tasks as `[{name, path}]` (one GRPO group each), via the dataset loader, and
    the local dataset's task folders that Harbor leaves out (`catalog.unlisted_tasks`), so the
    run can say so. A dataset whose source did not answer is DatasetUnreachable."""
    from tapdeck.runner.catalog import dataset_problem, local_folder, unlisted_tasks
    from tapdeck.runner.datasets import SAMPLE_DATASET_NAME, DatasetError, resolve_dataset

    spec = plan.dataset or SAMPLE_DATASET_NAME
    try:
        dataset = resolve_dataset(plan.dataset)
    except DatasetError as exc:
        problem = dataset_problem(spec, exc)
        raise (DatasetUnreachable if problem.unreachable else PlanError)(problem.message) from exc
    except Exception as exc:
        raise PlanError(f"cannot load dataset {plan.dataset or '(sample)'}: {exc}") from exc
    folder = local_folder(spec)
    left_out = unlisted_tasks(folder) if folder is not None else {}
    tasks = [{"name": t.name, "path": str(t.path)} for t in dataset.tasks]
    if plan.tasks:
        by_name = {t["name"]: t for t in tasks}
        broken = [left_out[n] for n in plan.tasks if n in left_out]
        if broken:
            raise PlanError(f"not a task Harbor can run: {'; '.join(broken)}")
        missing = [n for n in plan.tasks if n not in by_name]
        if missing:
            raise PlanError(
                f"unknown task(s) {', '.join(missing)}; the dataset has "
                f"{', '.join(sorted(by_name)) or 'no tasks'}"
            )
        tasks = [by_name[n] for n in plan.tasks]
    if plan.n_tasks is not None:
        tasks = tasks[: plan.n_tasks]
    if not tasks:
        raise PlanError(f"dataset {plan.dataset or '(sample)'} has no tasks")
    if len(tasks) * plan.k > MAX_ROLLOUTS:
        raise PlanError(
            f"{len(tasks)} task(s) × k {plan.k} is {len(tasks) * plan.k} rollouts, "
            f"more than the {MAX_ROLLOUTS} a run may have; run fewer tasks or a "
            "smaller k"
        )
    # Named tasks were each found, so a folder left out is only news when the dataset is taken whole.
    return tasks, [] if plan.tasks else list(left_out.values())


def check_sandbox(plan: RunPlan) -> None:
    """PlanError for a sandbox name that is neither `host`, a Harbor backend nor `module:Class`, or
    a docker sandbox `network` that is none of its choices."""
    from tapdeck.runner.catalog import DOCKER_SANDBOX, sandbox_environment_config
    from tapdeck.runner.sandboxes.docker_sandbox import network_mode

    kwargs = plan.rollout.sandbox_kwargs or {}
    try:
        sandbox_environment_config(plan.rollout.sandbox, **kwargs)
        if plan.rollout.sandbox == DOCKER_SANDBOX:
            network_mode(str(kwargs.get("network", "auto")), agent_in_container=False, proxy_port=None)
    except ValueError as exc:
        raise PlanError(str(exc)) from None


__all__ = ["check_sandbox", "resolve_tasks"]
