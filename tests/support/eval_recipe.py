"""A recipe for tests that logs, with the real trackio package, what cpu-grpo logs around its
held-out eval (`trackio_runs.eval_run_logs`) and trains nothing: the server launches it as it
launches any recipe (`python -m tests.support.eval_recipe`), so `tapdeck train` and the Train screen
read a real job's real trackio database in seconds. `--no-eval` logs the training metrics alone."""

from __future__ import annotations

import argparse
import os

from tests.support.trackio_runs import eval_run_logs


def arg_parser() -> argparse.ArgumentParser:
    """Its options (the server asks its parser before a launch, as for any recipe)."""
    p = argparse.ArgumentParser(prog="eval-recipe")
    p.add_argument("--no-eval", action="store_true", help="log no eval metrics")
    return p


def main() -> None:
    args = arg_parser().parse_args()
    import trackio  # in the job's process only, as the real recipes do

    trackio.init(
        project=os.environ.get("TAPDECK_TRAIN_PROJECT", "tapdeck"),
        name=os.environ.get("TAPDECK_TRAIN_RUN_ID", "eval-recipe"),
    )
    for entry in eval_run_logs(with_eval=not args.no_eval):
        trackio.log(entry["metrics"], step=entry["step"])
        print(f"eval-recipe: logged step {entry['step']}", flush=True)
    trackio.finish()


if __name__ == "__main__":
    main()
