"""Run in the training environment: what a recipe there can import, and the pinned stack's versions.

Prints JSON: the interpreter, the versions of the training stack, whether the names grpo-trl trains
with resolve, and which tapdeck modules importing the recipes pulled in.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys

import torch

from tapdeck.runner.recipes import admin_client, data_check, grpo_trl  # noqa: F401  (what recipes import)

stack = grpo_trl.training_stack()
print(
    json.dumps(
        {
            "python": list(sys.version_info[:2]),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "versions": {
                d: importlib.metadata.version(d)
                for d in ("trl", "openenv", "transformers", "trackio", "gguf")
            },
            "stack": sorted(vars(stack)),
            "tapdeck_modules": sorted(m for m in sys.modules if m.startswith("tapdeck")),
        }
    )
)
