# shellcheck shell=bash
# Debian packages the scripts need, installed only when missing. Sourced by scripts/test,
# scripts/bench, scripts/chaos and the other scripts that install.

# apt_install PACKAGE...: installs Debian's packages (one `apt-get update` per script run).
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "${APT_UPDATED:-}" ]; then
        apt-get update -qq >/dev/null
        APT_UPDATED=1
    fi
    apt-get install -y -qq "$@" >/dev/null
}

# ensure_command NAME PACKAGE [FALLBACK_PACKAGE] [WHY]: installs Debian's PACKAGE (or the
# fallback when PACKAGE is not available) when NAME is neither on the PATH nor in /usr/sbin.
ensure_command() {
    local name="$1" package="$2" fallback="${3:-}" why="${4:-}"
    if command -v "$name" >/dev/null 2>&1 || [ -x "/usr/sbin/$name" ]; then
        return 0
    fi
    echo "$name is missing${why:+ ($why)}; installing Debian's $package" >&2
    apt_install "$package" || { [ -n "$fallback" ] && apt_install "$fallback"; }
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
