# shellcheck shell=bash
# The Node.js client of the tests (sourced by scripts/test): @segment/analytics-node, the
# published Node client of the Segment HTTP Tracking API, which the ingest tests drive against
# the running system (tests/ingest/node_sdk.mjs), installed with npm into a folder of its own.
# Installs Debian's nodejs and npm when they are missing.

SEGMENT_ANALYTICS_NODE_VERSION="3.1.0"

# ensure_test_node: installs the client into ${TEST_NODE_DIR:-target/test-node} (relative to
# the current directory) and exports TEST_NODE_MODULES (its node_modules).
ensure_test_node() {
    local dir
    dir="$(realpath -m "${TEST_NODE_DIR:-target/test-node}")"
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "node or npm is missing (the ingest tests drive a Node client); installing Debian's nodejs and npm" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq nodejs npm >/dev/null
    fi
    local installed="$dir/node_modules/@segment/analytics-node/package.json"
    if ! grep -q "\"version\": \"$SEGMENT_ANALYTICS_NODE_VERSION\"" "$installed" 2>/dev/null; then
        echo "installing @segment/analytics-node $SEGMENT_ANALYTICS_NODE_VERSION into $dir" >&2
        mkdir -p "$dir"
        npm install --silent --no-audit --no-fund --prefix "$dir" \
            "@segment/analytics-node@$SEGMENT_ANALYTICS_NODE_VERSION" >/dev/null
    fi
    export TEST_NODE_MODULES="$dir/node_modules"
}
