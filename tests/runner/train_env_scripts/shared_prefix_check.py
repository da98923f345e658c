"""Run in the training environment: tapdeck's shared-prompt scoring against TRL 1.16's own.

A small Llama (random weights, seeded) with TRL's fused LM head at temperature 0.7 scores one
batch two ways: TRL's `GRPOTrainer._get_per_token_logps_and_entropies` (unbound, on a minimal
trainer state) and `shared_prefix_logps`. The batch is two groups of rows, each group sharing a
left-padded prompt, with right-padded completions of different lengths. Prints, as JSON: the
largest |difference| of the logprobs, of their entropies and of the gradients of a GRPO-like loss
over them, the largest gradient, and what `shared_prefix_logps` returns for rows whose prompts
differ.
"""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from tapdeck.runner.recipes.shared_prefix import shared_prefix_logps

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)
model = LlamaForCausalLM(config).float()
add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
PAD = 0


def batch() -> tuple[torch.Tensor, torch.Tensor, int]:
    """Two groups of three rows: prompts of 9 and 6 tokens left-padded to 9, completions right-padded
    to 7."""
    prompt_len, completion_len = 9, 7
    rows, masks = [], []
    for n_prompt, lengths in ((9, (7, 4, 6)), (6, (2, 7, 5))):
        prompt = torch.randint(1, config.vocab_size, (n_prompt,)).tolist()
        for n in lengths:
            completion = torch.randint(1, config.vocab_size, (n,)).tolist()
            left, right = prompt_len - n_prompt, completion_len - n
            rows.append([PAD] * left + prompt + completion + [PAD] * right)
            masks.append([0] * left + [1] * (n_prompt + n) + [0] * right)
    return torch.tensor(rows), torch.tensor(masks), completion_len


def trl_logps(ids: torch.Tensor, mask: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    accelerator = SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True)
    state = SimpleNamespace(accelerator=accelerator)
    logps, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        state, model, ids, mask, keep, compute_entropy=True
    )
    return logps, entropies


def loss_grads(logps: torch.Tensor, mask: torch.Tensor, keep: int) -> list[torch.Tensor]:
    """The gradients of a GRPO-shaped loss (per-row advantage × masked mean of exp(logp − logp.detach()))."""
    model.zero_grad()
    advantages = torch.tensor([1.0, -0.5, -0.5, 0.8, -1.2, 0.4]).unsqueeze(1)
    completion_mask = mask[:, -keep:].float()
    ratio = torch.exp(logps - logps.detach())
    loss = -((ratio * advantages * completion_mask).sum(1) / completion_mask.sum(1)).mean()
    loss.backward()
    return [p.grad.detach().clone() for p in model.parameters()]


ids, mask, keep = batch()
reference, reference_entropy = trl_logps(ids, mask, keep)
reference_grads = loss_grads(reference, mask, keep)
shared, shared_entropy = shared_prefix_logps(model, ids, mask, keep, entropy=True)
shared_grads = loss_grads(shared, mask, keep)
valid = mask[:, -keep:].bool()
pairs = zip(reference_grads, shared_grads, strict=True)
unshared = ids.clone()
unshared[0, 8] = (unshared[0, 8] % (config.vocab_size - 1)) + 1  # the first row's prompt differs
print(
    json.dumps(
        {
            "shape": [list(reference.shape), list(shared.shape)],
            "logps_max_diff": float((reference - shared)[valid].abs().max()),
            "logps_max": float(reference[valid].abs().max()),
            "entropy_max_diff": float((reference_entropy - shared_entropy)[valid].abs().max()),
            "entropy_max": float(reference_entropy[valid].abs().max()),
            "grad_max_diff": max(float((a - b).abs().max()) for a, b in pairs),
            "grad_max": max(float(a.abs().max()) for a in reference_grads),
            "unshared_rows": shared_prefix_logps(model, unshared, mask, keep) is None,
        }
    )
)
