"""Whether a body has the structure of a recorded vLLM one (tests/fixtures/vllm)."""

from __future__ import annotations

from typing import Any


def assert_same_shape(ours: Any, recorded: Any, path: str = "$", *, mappings: tuple[str, ...] = ()) -> None:
    """Assert `ours` has the structure of a recorded vLLM body: the same keys at every level and
    the same JSON type for every value (null vs null, int vs int, float vs float; numbers may be
    either int or float where vLLM wrote a float). Lists are compared element by element, using
    the recorded list's first element for extra elements of ours. Objects under a key named in
    `mappings` are data maps (pass `("top_logprobs",)` for legacy completions, whose entries are
    `{token: logprob}`): only their
    value types are compared.
    """
    if isinstance(recorded, dict) and path.split(".")[-1].split("[")[0] in mappings:
        assert isinstance(ours, dict), f"{path}: expected an object, got {type(ours).__name__}"
        sample = next(iter(recorded.values()), None)
        for key, value in ours.items():
            assert isinstance(key, str)
            if sample is not None:
                assert_same_shape(value, sample, f"{path}[{key!r}]", mappings=mappings)
    elif isinstance(recorded, dict):
        assert isinstance(ours, dict), f"{path}: expected an object, got {type(ours).__name__}"
        assert set(ours) == set(recorded), (
            f"{path}: keys differ: missing {sorted(set(recorded) - set(ours))}, "
            f"extra {sorted(set(ours) - set(recorded))}"
        )
        for key in recorded:
            assert_same_shape(ours[key], recorded[key], f"{path}.{key}", mappings=mappings)
    elif isinstance(recorded, list):
        assert isinstance(ours, list), f"{path}: expected a list, got {type(ours).__name__}"
        if recorded:
            for i, item in enumerate(ours):
                assert_same_shape(
                    item, recorded[min(i, len(recorded) - 1)], f"{path}[{i}]", mappings=mappings
                )
    elif recorded is None:
        assert ours is None, f"{path}: expected null, got {ours!r}"
    elif isinstance(recorded, bool):
        assert isinstance(ours, bool), f"{path}: expected a bool, got {ours!r}"
    elif isinstance(recorded, int):
        assert isinstance(ours, int) and not isinstance(ours, bool), f"{path}: expected an int, got {ours!r}"
    elif isinstance(recorded, float):
        assert isinstance(ours, (int, float)) and not isinstance(ours, bool), (
            f"{path}: expected a number, got {ours!r}"
        )
    else:
        assert type(ours) is type(recorded), (
            f"{path}: expected {type(recorded).__name__}, got {type(ours).__name__} ({ours!r})"
        )
