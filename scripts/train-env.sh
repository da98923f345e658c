#!/usr/bin/env bash
# Creates the training environment: a Python 3.11 venv with CPU torch, TRL, OpenEnv, transformers,
# gguf and trackio, every package pinned in scripts/train-env.txt. Separate from .venv because TRL's
# stack wants torch, and the torch wheel this kind of machine carries on disk is a CPU build for
# Python 3.11 (pip finds it through its find-links config); for 3.12 pip would fetch a CUDA build.
#
# Idempotent and safe to run concurrently (a lock serialises builders; a stamp skips a finished one).
# Prints the environment's python on stdout; progress goes to stderr.
#   TAPDECK_TRAIN_ENV     where to make it (default ~/.cache/tapdeck/train-env)
#   TAPDECK_TRAIN_PYTHON  the interpreter to build it from (default: python3.11 on PATH, then pyenv)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_dir="${TAPDECK_TRAIN_ENV:-$HOME/.cache/tapdeck/train-env}"
lock_file="$here/scripts/train-env.txt"
stamp="$env_dir/.tapdeck-train-env"
want="$(cat "$lock_file" "$here/scripts/train-env.sh" | sha256sum | cut -d' ' -f1)"

is_py311() { "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' >/dev/null 2>&1; }

find_python() {
    local cand
    for cand in "${TAPDECK_TRAIN_PYTHON:-}" python3.11; do
        [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && is_py311 "$cand" && { command -v "$cand"; return; }
    done
    for cand in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.11*/bin/python3 /usr/local/bin/python3.11 /opt/python*/bin/python3.11; do
        [ -x "$cand" ] && is_py311 "$cand" && { echo "$cand"; return; }
    done
    return 1
}

done_already() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$env_dir/bin/python" ]; }

if done_already; then
    echo "$env_dir/bin/python"
    exit 0
fi

mkdir -p "$(dirname "$env_dir")"
exec 9>"$env_dir.lock"
flock 9
if done_already; then  # another builder finished while we waited for the lock
    echo "$env_dir/bin/python"
    exit 0
fi

if ! py="$(find_python)"; then
    cat >&2 <<'MSG'
train-env: the training environment needs Python 3.11 (trl 1.16 needs >= 3.11; the CPU torch wheel
tapdeck pins is built for 3.11), and none was found on PATH or in pyenv. Install one, for example:
    pyenv install 3.11
    apt-get install python3.11 python3.11-venv
or point TAPDECK_TRAIN_PYTHON at an interpreter.
MSG
    exit 1
fi

if ! is_py311 "$env_dir/bin/python"; then
    echo "train-env: creating $env_dir with $py ($("$py" --version 2>&1))" >&2
    rm -rf "$env_dir"
    "$py" -m venv "$env_dir"
fi
pip=("$env_dir/bin/python" -m pip --disable-pip-version-check -q)
# The +cpu wheel is found only where pip has it locally (find-links); PyPI's torch is a CUDA build.
if ! "${pip[@]}" install --dry-run --ignore-installed --no-deps --report - "torch==2.13.0" 2>/dev/null | grep -q '+cpu'; then
    # The lock holds the CPU build's (empty) CUDA dependency set; PyPI's build needs its nvidia-* wheels.
    echo "train-env: no CPU torch wheel is reachable: installing PyPI's torch 2.13.0, a CUDA build with its nvidia-* dependencies (several GB)" >&2
    "${pip[@]}" install "torch==2.13.0" >&2
fi
echo "train-env: installing torch (CPU), trl, openenv, transformers, gguf, trackio (a few minutes)" >&2
"${pip[@]}" install --no-deps -r "$lock_file" >&2
"${pip[@]}" check >&2
echo "$want" > "$stamp"
echo "train-env: done" >&2
echo "$env_dir/bin/python"
