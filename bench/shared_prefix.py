"""The trainer's forward and backward pass over a GRPO group: TRL's, and with the shared prompt once.

    .venv/bin/python bench/shared_prefix.py [--group 4] [--prompt 762] [--completion 250]
                                            [--rounds 3] [--threads 1]

cpu-grpo's rows on the learn set (terminus-2, 2 turns): a prompt of about 762 tokens, the same for
the group's rollouts, and completions of a few hundred (the replies and the terminal's output
between them). This builds such a batch of token ids (drawn at random; the cost does not depend
on which), loads the shipped model as cpu-grpo trains it (SmolLM2-135M dequantised to float32,
TRL's fused LM head), and times, alternately, `--rounds` times each, one forward and backward pass
of a GRPO-shaped loss two ways: TRL 1.16's `_get_per_token_logps_and_entropies` and
`recipes/shared_prefix.py`. Prints the median of each, their ratio, and the largest logprob and
gradient differences between the two. Runs itself in the training environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace


def args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", type=int, default=4, help="rollouts sharing the prompt")
    parser.add_argument("--prompt", type=int, default=762, help="prompt tokens")
    parser.add_argument("--completion", type=int, default=250, help="longest completion (others shorter)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (cpu-grpo's probe chose 1)")
    parser.add_argument("--in-train-env", action="store_true", help=argparse.SUPPRESS)
    return parser


def relaunch(argv: list[str]) -> int:
    """Run this script in the training environment, with this tapdeck on its path."""
    from tapdeck.runner.engine.model_file import default_model_path
    from tapdeck.runner.train_env import env_dir
    from tapdeck.runner.training import package_path

    python = env_dir() / "bin" / "python"
    if not python.is_file():
        sys.exit(f"no training environment at {env_dir()}: run scripts/train-env.sh first")
    env = {
        **os.environ,
        "PYTHONPATH": str(package_path(Path.home() / ".cache" / "tapdeck" / "bench")),
        "TAPDECK_MODEL_GGUF": str(default_model_path()),
    }
    return subprocess.run([str(python), __file__, "--in-train-env", *argv], env=env, check=False).returncode


def measure(args: argparse.Namespace) -> dict:
    import torch
    from trl import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    from tapdeck.runner.engine.policy import load_policy
    from tapdeck.runner.recipes.shared_prefix import shared_prefix_logps

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model, _ = load_policy(Path(os.environ["TAPDECK_MODEL_GGUF"]))
    add_fused_lm_head(model, temperature=0.6)
    vocab = model.config.vocab_size
    prompt = torch.randint(3, vocab, (args.prompt,))
    lengths = [max(1, args.completion - 60 * i) for i in range(args.group)]
    rows, masks = [], []
    for n in lengths:
        completion = torch.randint(3, vocab, (n,))
        pad = args.completion - n
        rows.append(torch.cat([prompt, completion, torch.zeros(pad, dtype=torch.long)]))
        masks.append(
            torch.cat([torch.ones(args.prompt + n, dtype=torch.long), torch.zeros(pad, dtype=torch.long)])
        )
    ids, mask, keep = torch.stack(rows), torch.stack(masks), args.completion
    completion_mask = mask[:, -keep:].float()
    state = SimpleNamespace(
        accelerator=SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True)
    )

    def trl(ids: torch.Tensor, mask: torch.Tensor, keep: int) -> torch.Tensor:
        return GRPOTrainer._get_per_token_logps_and_entropies(state, model, ids, mask, keep)[0]

    def shared(ids: torch.Tensor, mask: torch.Tensor, keep: int) -> torch.Tensor:
        return shared_prefix_logps(model, ids, mask, keep)[0]

    def step(score) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        started = time.perf_counter()
        logps = score(ids, mask, keep)
        ratio = torch.exp(logps - logps.detach())
        (-(ratio * completion_mask).sum() / completion_mask.sum()).backward()
        took = time.perf_counter() - started
        return (
            took,
            logps.detach(),
            [p.grad.detach().clone() for p in model.parameters() if p.grad is not None],
        )

    times: dict[str, list[float]] = {"trl": [], "shared": []}
    outputs = {}
    for _ in range(args.rounds):
        for name, score in (("trl", trl), ("shared", shared)):
            took, logps, grads = step(score)
            times[name].append(took)
            outputs[name] = (logps, grads)
    valid = completion_mask.bool()
    (a, ga), (b, gb) = outputs["trl"], outputs["shared"]
    return {
        "tokens": [args.group, args.prompt, lengths],
        "trl_s": statistics.median(times["trl"]),
        "shared_s": statistics.median(times["shared"]),
        "all_s": times,
        "logps_max_diff": float((a - b)[valid].abs().max()),
        "grad_max_diff": max(float((x - y).abs().max()) for x, y in zip(ga, gb, strict=True)),
        "grad_max": max(float(x.abs().max()) for x in ga),
    }


def main() -> int:
    args = args_parser().parse_args()
    if not args.in_train_env:
        return relaunch(sys.argv[1:])
    found = measure(args)
    group, prompt, lengths = found["tokens"]
    print(
        f"a group of {group} rows: a shared prompt of {prompt} tokens, completions of {lengths} tokens; "
        f"{args.threads} torch thread(s), {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"forward + backward, TRL's path:    median {found['trl_s']:.2f} s of {args.rounds}")
    print(f"forward + backward, shared prompt: median {found['shared_s']:.2f} s of {args.rounds}")
    print(f"ratio TRL / shared: {found['trl_s'] / found['shared_s']:.2f}x")
    print(
        f"largest |logprob difference| {found['logps_max_diff']:.1e}; largest |gradient difference| "
        f"{found['grad_max_diff']:.1e} (largest gradient {found['grad_max']:.1e})"
    )
    print(json.dumps(found["all_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
