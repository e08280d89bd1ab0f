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

# ensure_postfix_tools: Postfix's smtp-sink and smtp-source, extracted from Debian's package
# into ${POSTFIX_DIR:-target/postfix} (not installed: installing configures a mail server);
# sets POSTFIX_DIR and LD_LIBRARY_PATH for them. Needs a scratch folder in SCRATCH.
ensure_postfix_tools() {
    POSTFIX_DIR="${POSTFIX_DIR:-target/postfix}"
    if [ ! -x "$POSTFIX_DIR/usr/sbin/smtp-sink" ]; then
        echo "extracting Postfix's smtp-sink and smtp-source into $POSTFIX_DIR" >&2
        mkdir -p "$POSTFIX_DIR"
        (cd "$SCRATCH" && apt-get download postfix >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get download postfix >/dev/null; })
        dpkg -x "$SCRATCH"/postfix_*.deb "$POSTFIX_DIR"
    fi
    export LD_LIBRARY_PATH="$PWD/$POSTFIX_DIR/usr/lib/postfix${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
