"""Does the policy learn? eval → `cpu-grpo` for N steps → eval, on the shipped learnable task set.

    .venv/bin/python bench/learn.py [--steps 20] [--group-size 4] [--eval-k 8] [--lr 2e-5] ...

Starts a `tapdeck serve` on a fresh data dir, launches `cpu-grpo` there as `tapdeck train` does
(`POST /admin/train`): SmolLM2-135M trained by TRL's GRPOTrainer on the `learn` tasks through
terminus-2 on the host sandbox, every rollout sampled by the weights being trained, evaluated on
the held-out `learn-eval` tasks before the first step and after the last (the recipe's
`--eval-dataset`). Prints, from the run's own trackio metrics and log: the eval verifier reward
before and after with n and 95% intervals, the change with its interval, each step's training
reward (verifier and format credit) and where its time went, and the whole run's time. Nothing is
asserted: the figures are the result. Needs the training environment (scripts/train-env.sh).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

_spec = importlib.util.spec_from_file_location("bench_proxy", Path(__file__).with_name("proxy.py"))
assert _spec is not None and _spec.loader is not None
bench_proxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_proxy)

STEP_LINE = re.compile(
    r"step (\d+)/\d+: ([\d.]+) s = rollouts ([\d.]+) s \+ "
    r"forward/backward ([\d.-]+) s \+ optimizer ([\d.]+) s"
)


def recipe_args(args: argparse.Namespace) -> list[str]:
    """The cpu-grpo command line the bench runs."""
    return [
        *("--dataset", "learn", "--eval-dataset", "learn-eval", "--eval-k", str(args.eval_k)),
        *("--steps", str(args.steps), "--group-size", str(args.group_size)),
        *("--max-turns", str(args.max_turns), "--max-tokens", str(args.max_tokens)),
        *("--call-budget", str(args.call_budget), "--temperature", str(args.temperature)),
        *("--lr", str(args.lr), "--seed", str(args.seed), "--redraws", str(args.redraws)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--eval-k", type=int, default=8, help="eval rollouts per held-out task")
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--call-budget", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--redraws", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds before the run is stopped")
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="tapdeck-learn-"))
    port, key = bench_proxy.free_port(), f"tdk-admin-{secrets.token_urlsafe(24)}"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    tapdeck = str(Path(sys.executable).with_name("tapdeck"))
    serve = [tapdeck, "serve", "--port", str(port), "--admin-key", key, "--data-dir", str(data)]
    server = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"})
    started = time.monotonic()
    load_before = os.getloadavg()
    try:
        while True:
            try:
                if http.get("/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() - started > 300:
                raise SystemExit(f"tapdeck serve did not start (data dir {data})")
            time.sleep(0.5)
        argv = recipe_args(args)
        print(f"cpu-grpo {' '.join(argv)}", flush=True)
        resp = http.post("/admin/train", json={"recipe": "cpu-grpo", "args": argv}, timeout=60)
        resp.raise_for_status()
        job = resp.json()["id"]
        lines: list[str] = []
        while True:
            state = http.get(f"/admin/train/{job}", timeout=30).json()
            log = http.get(f"/admin/train/{job}/log", params={"tail": 5000}, timeout=30).json()["lines"]
            for line in log[len(lines) :]:
                if "[cpu-grpo]" in line:  # after a progress bar's carriage return, on a step's line
                    print(f"  {line[line.index('[cpu-grpo]') :]}", flush=True)
            lines = log
            if state["state"] != "running":
                break
            if time.monotonic() - started > args.timeout:
                http.post(f"/admin/train/{job}/stop", timeout=60)
                print(f"stopped after {args.timeout:.0f} s", flush=True)
            time.sleep(5)
        wall = time.monotonic() - started
        points = http.get(f"/admin/train/{job}/metrics", timeout=60).json()["points"]
    finally:
        http.close()
        server.terminate()
        server.wait(60)
    report(args, state, lines, points, wall, load_before)
    return 0 if state["state"] == "finished" else 1


def report(
    args: argparse.Namespace,
    state: dict,
    lines: list[str],
    points: list[dict],
    wall: float,
    load_before: tuple[float, float, float],
) -> None:
    by_name: dict[str, list[tuple[int, float]]] = {}
    for p in points:
        by_name.setdefault(p["name"], []).append((p["step"], p["value"]))
    print(
        f"\n{os.cpu_count()} cores, load average {load_before[0]:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end; run {state['state']}"
        + (f" ({state.get('error')})" if state.get("error") else "")
    )
    evals = by_name.get("eval/verifier_reward", [])
    for label, (step, mean) in zip(("before", "after"), [*evals[:1], *evals[1:][-1:]], strict=False):
        n = dict(by_name.get("eval/n", [])).get(step, 0)
        low = dict(by_name.get("eval/verifier_reward_ci_low", [])).get(step, float("nan"))
        high = dict(by_name.get("eval/verifier_reward_ci_high", [])).get(step, float("nan"))
        print(f"eval {label:6} (step {step:2}): verifier reward {mean:.3f}  n {n:.0f}  ", end="")
        print(f"95% CI {low:.3f}–{high:.3f}")
    if delta := by_name.get("eval/verifier_reward_delta"):
        low = by_name["eval/verifier_reward_delta_ci_low"][-1][1]
        high = by_name["eval/verifier_reward_delta_ci_high"][-1][1]
        print(f"change: {delta[-1][1]:+.3f}  95% CI {low:+.3f} to {high:+.3f}")
    print("\nstep  verifier  format  step s  rollouts s  fwd/bwd s  optimizer s")
    verifier = dict(by_name.get("train/rewards/verifier/mean", []))
    fmt = dict(by_name.get("train/rewards/reply_format/mean", []))
    profile = {int(m[1]): m.groups()[1:] for line in lines if (m := STEP_LINE.search(line))}
    # trackio numbers TRL's rows from 1 when the eval took step 0, else from 0: key by order.
    train_steps = sorted(verifier)
    for k, step in enumerate(train_steps, start=1):
        times = profile.get(k, ("", "", "", ""))
        print(
            f"{k:4}  {verifier.get(step, float('nan')):8.3f}  {fmt.get(step, float('nan')):6.3f}  "
            + "  ".join(f"{t:>9}" for t in times)
        )
    print(f"\nwhole bench: {wall / 60:.1f} min")


if __name__ == "__main__":
    sys.exit(main())
