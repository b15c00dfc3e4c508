# Sourced by kiln's scripts (not run): repository paths, the test-data virtual
# environment, and a timing helper.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

KILN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Everything downloaded or generated for tests; the Rust tests read it via $KILN_TEST_DATA.
KILN_CACHE="${KILN_CACHE:-$KILN_ROOT/.cache}"
# Virtual environment holding the pinned packages of scripts/requirements.txt.
KILN_VENV="$KILN_ROOT/.venv"
KILN_VPY="$KILN_VENV/bin/python"

# The interpreter that creates the virtual environment: $KILN_PYTHON if set, else
# python3.11 when present (the version the pins are made for), else python3.
if [[ -z "${KILN_PYTHON:-}" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then
        KILN_PYTHON=python3.11
    else
        KILN_PYTHON=python3
    fi
fi

# kiln_step NAME CMD...: prints NAME, runs CMD, prints how long it took.
kiln_step() {
    local name="$1"
    shift
    echo "==> $name" >&2
    local t0=$SECONDS
    "$@"
    echo "<== $name: $((SECONDS - t0)) s" >&2
}
