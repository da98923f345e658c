"""The reward rule: from a verifier's reward dict to one scalar, or an explicit refusal.

Rule (capture-cases J): one key → it; a named `reward_key` → it (missing → error listing the keys);
several keys including `reward` → `reward`; several others → refuse and list the keys. Each value is
coerced on its own (a bad value drops that key with a WARN, it never sinks the others). A verifier
that never ran, or wrote nothing usable, gives `reward=None` with a finding: never 0.

Harbor rejects a whole `reward.json` when one value is not a finite number, so `read_reward_files`
re-reads the files the verifier left in the trial directory with the per-value coercion.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapdeck.schema.findings import Finding

REWARD_AMBIGUOUS = "reward_ambiguous"
REWARD_KEY_MISSING = "reward_key_missing"


@dataclass
class RewardChoice:
    """Outcome of the reward rule for one rollout."""

    reward: float | None
    """The chosen scalar; None = never graded (or refused), never silently 0."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Every value that survived coercion."""
    key: str | None = None
    """Which key the scalar came from."""
    findings: list[Finding] = field(default_factory=list)
    error_kind: str | None = None
    """`reward_ambiguous` / `reward_key_missing` when the rule refused to choose."""
    error: str | None = None


def coerce_value(value: Any) -> float | None:
    """A finite float, or None when the value is not a usable reward (bool, None, text, dict, NaN, ±inf)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def coerce_rewards(raw: Mapping[str, Any]) -> tuple[dict[str, float], list[Finding]]:
    """Coerce each value alone; a bad one is dropped with a WARN naming the key and the value."""
    kept: dict[str, float] = {}
    findings: list[Finding] = []
    for key, value in raw.items():
        number = coerce_value(value)
        if number is None:
            findings.append(
                Finding.warn(
                    "reward_value_dropped", f"key {key!r} has no finite numeric value ({_short(value)})"
                )
            )
        else:
            kept[str(key)] = number
    return kept, findings


def choose_reward(raw: Mapping[str, Any] | None, reward_key: str | None = None) -> RewardChoice:
    """Apply the reward rule to a verifier's reward dict (None = the verifier never produced one)."""
    if raw is None:
        return RewardChoice(
            None,
            findings=[
                Finding.warn(
                    "reward_missing",
                    "the verifier produced no rewards (it never ran or failed); reward is null, not 0",
                )
            ],
        )
    if not isinstance(raw, Mapping):
        raw = {"reward": raw}
    rewards, findings = coerce_rewards(raw)
    keys = sorted(str(k) for k in raw)
    if not raw:
        findings.append(
            Finding.warn("reward_missing", "the verifier wrote an empty reward dict; reward is null, not 0")
        )
        return RewardChoice(None, rewards, findings=findings)

    if reward_key is not None:
        if reward_key not in raw:
            message = (
                f"reward key {reward_key!r} is not among the verifier's keys "
                f"{', '.join(keys)}; pick one with --reward-key"
            )
            findings.append(Finding.fatal(REWARD_KEY_MISSING, message))
            return RewardChoice(None, rewards, None, findings, REWARD_KEY_MISSING, message)
        return _take(reward_key, rewards, findings)
    if len(raw) == 1:
        return _take(keys[0], rewards, findings)
    if "reward" in raw:
        return _take("reward", rewards, findings)
    if len(rewards) == 1:
        # The other keys were unusable values: the single surviving one is unambiguous.
        return _take(next(iter(rewards)), rewards, findings)
    if not rewards:
        findings.append(Finding.warn("reward_missing", f"no usable reward among keys {', '.join(keys)}"))
        return RewardChoice(None, rewards, None, findings)
    message = (
        f"the verifier returned several rewards ({', '.join(sorted(rewards))}) and none is "
        f"named 'reward'; choose one with --reward-key"
    )
    findings.append(Finding.fatal(REWARD_AMBIGUOUS, message))
    return RewardChoice(None, rewards, None, findings, REWARD_AMBIGUOUS, message)


def _take(key: str, rewards: dict[str, float], findings: list[Finding]) -> RewardChoice:
    if key not in rewards:
        findings.append(
            Finding.warn(
                "reward_missing", f"the chosen reward key {key!r} had no usable value; reward is null"
            )
        )
        return RewardChoice(None, rewards, key, findings)
    return RewardChoice(rewards[key], rewards, key, findings)


def read_reward_files(verifier_dir: Path) -> tuple[dict[str, Any] | None, list[Finding]]:
    """Leniently read `reward.json` (preferred, as Harbor does) or `reward.txt` from a trial's verifier dir.

    Returns the raw dict (values not yet coerced) or None when no usable file exists, with findings.
    """
    json_path = verifier_dir / "reward.json"
    text_path = verifier_dir / "reward.txt"
    if json_path.is_file():
        text = json_path.read_text(errors="replace")
        if not text.strip():
            return None, [Finding.warn("reward_file_empty", f"{json_path} is empty")]
        try:
            data = json.loads(text)
        except ValueError:
            return None, [Finding.warn("reward_file_unparseable", f"{json_path} is not JSON: {_short(text)}")]
        if isinstance(data, Mapping):
            return dict(data), []
        return {"reward": data}, []
    if text_path.is_file():
        text = text_path.read_text(errors="replace")
        if not text.strip():
            return None, [Finding.warn("reward_file_empty", f"{text_path} is empty")]
        return {"reward": text.strip()}, []
    return None, []


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
