#!/usr/bin/env bash
# tapdeck's one entry point on a fresh machine.
#   ./tapdeck.sh            set up (first time only) and open the TUI on the embedded defaults
#   ./tapdeck.sh test [ARGS]  set up and run the whole test suite (ARGS go to pytest)
#   ./tapdeck.sh test --fast  the fast tier only (no test marked slow or medium)
#   ./tapdeck.sh ARGS...    set up and run the tapdeck CLI with ARGS (e.g. `./tapdeck.sh info`)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/scripts/setup.sh" >&2
if [ "${1:-}" = "test" ]; then
    shift
    cd "$here"
    if [ "${1:-}" = "--fast" ]; then  # the fast tier: no `slow` or `medium` test (docs/development.md)
        shift
        set -- -m "not slow and not medium" "$@"
    fi
    exec "$here/.venv/bin/python" -m pytest "$@"
fi
exec "$here/.venv/bin/tapdeck" "$@"
