"""Fixtures for the proxy's tests: loaders of the recorded vLLM bodies (tests/fixtures/vllm).

The servers and the fake vLLM the proxy's server tests run against are tests/conftest.py's
(`make_server`, `admin_for`, `upstream`); tests/proxy/upstream has the fake in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.vllm_recordings import vllm_error_case, vllm_fixture


@pytest.fixture
def vllm() -> Callable[[str], dict[str, Any]]:
    """Loader of recorded fixture files (see `vllm_fixture`)."""
    return vllm_fixture


@pytest.fixture
def vllm_error() -> Callable[[str], tuple[int, dict[str, Any]]]:
    """Loader of errors.json cases (see `vllm_error_case`)."""
    return vllm_error_case
