"""Run in the training environment: the weights transformers dequantises from two GGUF files.

    python gguf_weights.py A.gguf B.gguf

Prints JSON: per parameter name of A, the largest |a - b| beyond F16's rounding of a
(|a - b| - 2**-11 * |a| - 2**-24, so <= 0 means B holds A's weight to within F16 rounding), and the
names only one file has.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tapdeck.runner.engine.policy import load_policy

a, _ = load_policy(Path(sys.argv[1]))
b, _ = load_policy(Path(sys.argv[2]))
pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
excess = {name: float(((pa[name] - pb[name]).abs() - 2 ** -11 * pa[name].abs() - 2 ** -24).max())
          for name in pa if name in pb and pa[name].shape == pb[name].shape}
print(json.dumps({"excess": excess, "only_in_one": sorted(set(pa) ^ set(pb)),
                  "shape_differs": sorted(n for n in pa if n in pb and pa[n].shape != pb[n].shape)}))
