# ensure_command NAME PACKAGE [FALLBACK_PACKAGE] [WHY]: installs Debian's PACKAGE (or the
# fallback when PACKAGE is not available) when NAME is neither on the PATH nor in /usr/sbin.
# Sourced by scripts/test, scripts/bench and scripts/chaos.
ensure_command() {
    local name="$1" package="$2" fallback="${3:-}" why="${4:-}"
    if command -v "$name" >/dev/null 2>&1 || [ -x "/usr/sbin/$name" ]; then
        return 0
    fi
    echo "$name is missing${why:+ ($why)}; installing Debian's $package" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "$package" >/dev/null || { [ -n "$fallback" ] && apt-get install -y -qq "$fallback" >/dev/null; }
}
