#!/usr/bin/env bash
# tapdeck's one entry point on a fresh machine.
#   ./tapdeck.sh            set up (first time only) and open the TUI on the embedded defaults
#   ./tapdeck.sh test [ARGS]  set up, ready Docker for the container tests (as root), and run the
#                             whole test suite (ARGS go to pytest)
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
    elif [ -n "${TAPDECK_NO_CONTAINER_TESTS:-}" ]; then
        echo "container tests: skipped (TAPDECK_NO_CONTAINER_TESTS is set)" >&2
    elif [ "$(id -u)" = 0 ]; then
        # The docker sandbox's tests need dockerd and the sample tasks' base image (seconds once built).
        "$here/scripts/container-sandbox.sh" >&2 || echo "container tests: the backend is not ready" \
            "(above); they will fail saying why" >&2
    else
        echo "container tests: cannot run: readying Docker needs root (scripts/container-sandbox.sh);" \
            "they fail unless Docker is ready or TAPDECK_NO_CONTAINER_TESTS=1" >&2
    fi
    # Workers (pytest-xdist): most tests wait on servers and subprocesses, not the CPU, so 3
    # workers on 2 cores cut the wall time (docs/development.md); TAPDECK_TEST_WORKERS=0: one process.
    exec "$here/.venv/bin/python" -m pytest -n "${TAPDECK_TEST_WORKERS:-3}" --dist worksteal "$@"
fi
exec "$here/.venv/bin/tapdeck" "$@"
