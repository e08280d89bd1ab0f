# shellcheck shell=bash
# The Python environment of the tests (sourced by scripts/test and scripts/fuzz): one venv
# with pinned versions of schemathesis (the spec-driven fuzzer), standardwebhooks (the
# reference implementation that the webhook receiver of the tests, tests/webhooks/receiver.py,
# verifies signatures with, so that they are not checked by our own Rust code), and aiosmtpd
# and dkimpy (the SMTP server and the DKIM verifier of the SMTP sink of the tests,
# tests/email/smtp_sink.py, so that what we send and sign is checked by independent code too),
# and dnslib (the loopback DNS server of the domain verification test, tests/email/dns_server.py),
# and the published Python clients of the Segment HTTP Tracking API, segment-analytics-python and
# rudder-sdk-python, which the ingest tests drive against the running system (tests/ingest).
# Installs Debian's python3-venv when the venv module is missing.

SCHEMATHESIS_VERSION="4.32.5"
STANDARDWEBHOOKS_VERSION="1.1.0"
AIOSMTPD_VERSION="1.4.6"
DKIMPY_VERSION="1.1.8"
DNSLIB_VERSION="0.9.26"
SEGMENT_ANALYTICS_VERSION="2.4.0"
RUDDER_SDK_VERSION="2.1.9"

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
        "$SCHEMATHESIS_VERSION" "$STANDARDWEBHOOKS_VERSION" "$AIOSMTPD_VERSION" "$DKIMPY_VERSION" \
        "$DNSLIB_VERSION" "$SEGMENT_ANALYTICS_VERSION" "$RUDDER_SDK_VERSION" >/dev/null 2>&1 <<'EOF'
import sys
from importlib.metadata import version
assert version("schemathesis") == sys.argv[1]
assert version("standardwebhooks") == sys.argv[2]
assert version("aiosmtpd") == sys.argv[3]
assert version("dkimpy") == sys.argv[4]
assert version("dnslib") == sys.argv[5]
assert version("segment-analytics-python") == sys.argv[6]
assert version("rudder-sdk-python") == sys.argv[7]
import segment.analytics.client  # noqa: F401
import rudderstack.analytics.client  # noqa: F401
import standardwebhooks.webhooks  # noqa: F401
import aiosmtpd.smtp  # noqa: F401
import dkim  # noqa: F401
import dnslib.server  # noqa: F401
EOF
}

# ensure_test_venv: creates (or completes) the venv at ${TEST_VENV:-target/test-venv}, relative
# to the current directory, and exports TEST_VENV (its absolute path) and TEST_PYTHON (its
# interpreter, which the Rust tests start the webhook receiver and the SMTP sink with).
ensure_test_venv() {
    local venv
    venv="$(realpath -m "${TEST_VENV:-target/test-venv}")"
    if ! test_venv_ready "$venv"; then
        echo "installing schemathesis $SCHEMATHESIS_VERSION, standardwebhooks $STANDARDWEBHOOKS_VERSION," \
            "aiosmtpd $AIOSMTPD_VERSION, dkimpy $DKIMPY_VERSION, dnslib $DNSLIB_VERSION," \
            "segment-analytics-python $SEGMENT_ANALYTICS_VERSION and rudder-sdk-python $RUDDER_SDK_VERSION into $venv" >&2
        ensure_python_venv_module
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check \
            "schemathesis==$SCHEMATHESIS_VERSION" "standardwebhooks==$STANDARDWEBHOOKS_VERSION" \
            "aiosmtpd==$AIOSMTPD_VERSION" "dkimpy==$DKIMPY_VERSION" "dnslib==$DNSLIB_VERSION" \
            "segment-analytics-python==$SEGMENT_ANALYTICS_VERSION" "rudder-sdk-python==$RUDDER_SDK_VERSION"
        if ! test_venv_ready "$venv"; then
            echo "the venv at $venv still lacks the pinned packages" >&2
            return 1
        fi
    fi
    export TEST_VENV="$venv"
    export TEST_PYTHON="$venv/bin/python"
}
