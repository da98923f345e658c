"""The trainer's forward pass over a GRPO group once per prompt, not once per rollout.

A group's rollouts share their prompt (terminus-2's first prompt: about 760 of a row's ~1,000
tokens on the learn set), and TRL's loss runs the model over every row whole: the prompt's
tokens are computed, and back-propagated, once per rollout. Here the backbone runs over a shared
prompt once, its KV cache is repeated for the group's rows, and the completions run on top of it.
Autograd sums the rows' gradients through the repeated cache, so the gradient is the same (up to
float rounding): only the repeated work goes. On CPU, TRL's fused LM head also scores every
position of the row (its compact path is Triton's), so the prompt's LM-head projection goes too.

Rows whose prompts differ (another task's group, a prompt an agent saw differently) and inputs
with anything besides token ids (images) take TRL's own path.
"""

from __future__ import annotations

from typing import Any


def prompt_groups(input_ids: Any, attention_mask: Any, prompt_len: int) -> list[list[int]] | None:
    """The row indexes of each set of rows with the same prompt (ids and mask over the first
    `prompt_len` positions), in first-seen order; None unless every row shares its prompt with
    another, or when there is no prompt to share."""
    if prompt_len < 2:
        return None
    groups: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    ids, mask = input_ids[:, :prompt_len].tolist(), attention_mask[:, :prompt_len].tolist()
    for row, key in enumerate(zip(map(tuple, ids), map(tuple, mask), strict=True)):
        groups.setdefault(key, []).append(row)
    found = list(groups.values())
    return found if all(len(rows) > 1 for rows in found) else None


def shared_prefix_logps(
    model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *, entropy: bool = False
) -> tuple[Any, Any] | None:
    """TRL's per-token logprobs of the last `logits_to_keep` tokens of each row (the fused LM
    head's, with the temperature it was added with), and their entropies when `entropy` (the
    head must have been added with them), with each shared prompt run once; None when the rows
    do not share their prompts (`prompt_groups`)."""
    import torch

    prompt_len = input_ids.size(1) - logits_to_keep
    groups = prompt_groups(input_ids, attention_mask, prompt_len)
    if groups is None:
        return None
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :prompt_len] = -100
    indexes, scored, entropies = [], [], []
    for rows in groups:
        first, index = rows[0], torch.tensor(rows)
        # The prompt less its last token: that token's position predicts the first completion
        # token, so it runs with the completions, where the fused head scores it.
        prefix = model.base_model(
            input_ids=input_ids[first : first + 1, : prompt_len - 1],
            attention_mask=attention_mask[first : first + 1, : prompt_len - 1],
            use_cache=True,
        )
        cache = prefix.past_key_values
        cache.batch_repeat_interleave(len(rows))
        out = model(
            input_ids=input_ids[index, prompt_len - 1 :],
            attention_mask=attention_mask[index],
            past_key_values=cache,
            labels=labels[index, prompt_len - 1 :],
            fused_lm_head=True,
        )
        indexes.append(index)
        scored.append(out.log_probs[:, -logits_to_keep:])
        if entropy:
            entropies.append(out.entropy[:, -logits_to_keep:])
    order = torch.argsort(torch.cat(indexes))  # back to the rows' own order
    return torch.cat(scored)[order], torch.cat(entropies)[order] if entropy else None


def with_shared_prefix(trainer_class: type) -> type:
    """`trainer_class` (TRL's GRPOTrainer) scoring a group's shared prompt once
    (`shared_prefix_logps`) where it can, and as TRL does elsewhere."""

    class SharedPrefix(trainer_class):  # type: ignore[valid-type,misc]
        shared_prefix_rows = 0
        """Rows scored over a shared prompt so far (the rest took TRL's path)."""

        def _get_per_token_logps_and_entropies(
            self,
            model: Any,
            input_ids: Any,
            attention_mask: Any,
            logits_to_keep: int,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            entropy = bool(kwargs.get("compute_entropy"))
            extras = [*args, *(v for k, v in kwargs.items() if k not in ("batch_size", "compute_entropy"))]
            if not any(x is not None and x is not False for x in extras):
                with self.accelerator.autocast():
                    found = shared_prefix_logps(
                        model, input_ids, attention_mask, logits_to_keep, entropy=entropy
                    )
                if found is not None:
                    self.shared_prefix_rows += input_ids.size(0)
                    return *found, None
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )

    return SharedPrefix


__all__ = ["prompt_groups", "shared_prefix_logps", "with_shared_prefix"]
