# shellcheck shell=bash
# The API reference page's renderer (sourced by scripts/test, scripts/start, scripts/bench and
# scripts/profile before they build): Redoc's standalone bundle, fetched from the npm registry
# with `npm pack` (one tarball, no dependency tree: the bundle is self-contained), checked
# against the integrity pinned here, and unpacked into query-service/reference/, where the
# query service's build embeds it. The page then loads nothing from any other host.
# Installs Debian's npm when npm is missing.

REDOC_VERSION="2.5.4"
# The tarball's SHA-512 (the registry's integrity, sha512-M6jWhG1q...rABQ==, in hex).
REDOC_SHA512="33a8d6846d6aa019c7e93166cc99ecb72099f3b1e6398fd4cc39bbf261e262284476557f61c4bda203a8d4d94496724c78bb32c4715edb215ce2c3631d3ac005"

ensure_reference_bundle() {
    local dir="query-service/reference"
    if [ -s "$dir/redoc.standalone.js" ] && [ "$(cat "$dir/redoc.version" 2>/dev/null)" = "$REDOC_VERSION" ]; then
        return 0
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "npm is missing (it fetches the reference page's renderer); installing Debian's npm" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq npm >/dev/null
    fi
    local work
    work="$(mktemp -d)"
    echo "fetching redoc $REDOC_VERSION from the npm registry for the reference page" >&2
    (cd "$work" && npm pack --silent "redoc@$REDOC_VERSION" >/dev/null)
    local tarball="$work/redoc-$REDOC_VERSION.tgz"
    local digest
    digest="$(sha512sum "$tarball" | cut -d' ' -f1)"
    if [ "$digest" != "$REDOC_SHA512" ]; then
        echo "redoc $REDOC_VERSION from the registry has SHA-512 $digest, not the pinned $REDOC_SHA512" >&2
        rm -rf "$work"
        return 1
    fi
    tar -xzf "$tarball" -C "$work" package/bundles/redoc.standalone.js package/bundles/redoc.standalone.js.LICENSE.txt
    cp "$work/package/bundles/redoc.standalone.js" "$work/package/bundles/redoc.standalone.js.LICENSE.txt" "$dir/"
    echo "$REDOC_VERSION" >"$dir/redoc.version"
    rm -rf "$work"
}
