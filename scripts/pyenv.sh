# shellcheck shell=bash
# The Python environment of the tests (sourced by scripts/test and scripts/fuzz): one venv
# with pinned versions of schemathesis (the spec-driven fuzzer) and standardwebhooks (the
# reference implementation that the webhook receiver of the tests, tests/webhooks/receiver.py,
# verifies signatures with, so that they are not checked by our own Rust code).
# Installs Debian's python3-venv when the venv module is missing.

SCHEMATHESIS_VERSION="4.32.5"
STANDARDWEBHOOKS_VERSION="1.1.0"

ensure_python_venv_module() {
    if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c "import ensurepip" >/dev/null 2>&1; then
        echo "python3-venv is missing (needed by the test venv); installing Debian's python3-venv" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq python3-venv >/dev/null
    fi
}

# test_venv_ready VENV: whether VENV holds exactly the pinned versions.
test_venv_ready() {
    [ -x "$1/bin/python" ] && [ -x "$1/bin/schemathesis" ] && "$1/bin/python" - \
        "$SCHEMATHESIS_VERSION" "$STANDARDWEBHOOKS_VERSION" >/dev/null 2>&1 <<'EOF'
import sys
from importlib.metadata import version
assert version("schemathesis") == sys.argv[1]
assert version("standardwebhooks") == sys.argv[2]
import standardwebhooks.webhooks  # noqa: F401
EOF
}

# ensure_test_venv: creates (or completes) the venv at ${TEST_VENV:-target/test-venv}, relative
# to the current directory, and exports TEST_VENV (its absolute path) and TEST_PYTHON (its
# interpreter, which the Rust tests start the webhook receiver with).
ensure_test_venv() {
    local venv
    venv="$(realpath -m "${TEST_VENV:-target/test-venv}")"
    if ! test_venv_ready "$venv"; then
        echo "installing schemathesis $SCHEMATHESIS_VERSION and standardwebhooks $STANDARDWEBHOOKS_VERSION into $venv" >&2
        ensure_python_venv_module
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check \
            "schemathesis==$SCHEMATHESIS_VERSION" "standardwebhooks==$STANDARDWEBHOOKS_VERSION"
        if ! test_venv_ready "$venv"; then
            echo "the venv at $venv still lacks the pinned packages" >&2
            return 1
        fi
    fi
    export TEST_VENV="$venv"
    export TEST_PYTHON="$venv/bin/python"
}
