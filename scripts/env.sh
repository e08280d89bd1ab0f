# shellcheck shell=bash
# The environment of the quick start's system, in one place (sourced by scripts/start,
# scripts/start-ha, their stops and scripts/platform): where its data lives, how to reach its PostgreSQL cluster, where its mail
# goes and (use_master_key) its master key. DATA_DIR, PG_PORT, PORT, APP__MASTER_KEY and the
# mail settings can be set beforehand to override them.

PLATFORM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA_DIR="${DATA_DIR:-$PLATFORM_ROOT/data}"
PG_PORT="${PG_PORT:-54329}"
PORT="${PORT:-8080}"
# The binary scripts/start runs and scripts/platform calls.
PLATFORM_BINARY="${CARGO_TARGET_DIR:-$PLATFORM_ROOT/target}/release/platform"

export APP__DATABASE__URL="host=127.0.0.1 port=$PG_PORT user=postgres dbname=platform"
export APP__HTTP__PORT="$PORT"
# No relay by default: mail is written as .eml files under the data directory (set
# APP__EMAIL__RELAY_URL, e.g. smtp://relay.example.com:587?tls=required, to really send).
export APP__EMAIL__EML_DIR="${APP__EMAIL__EML_DIR:-$DATA_DIR/outbox}"
export APP__EMAIL__PUBLIC_BASE_URL="${APP__EMAIL__PUBLIC_BASE_URL:-http://127.0.0.1:$PORT/v1}"
# The name the sending domains' SPF and return-path records point at (docs/operations.md,
# "Mail DNS"); the demo's is in the reserved .example zone, like its sending domain.
export APP__EMAIL__PLATFORM_DOMAIN="${APP__EMAIL__PLATFORM_DOMAIN:-mail-platform.demo.example}"
# Bounces and complaints come back over SMTP to the return-path listener here.
export APP__INBOUND__PORT="${APP__INBOUND__PORT:-2525}"
# The master key wraps every data subject's key: made once per data directory, kept with it
# (readable by the owner only). Set APP__MASTER_KEY to use a key from elsewhere.
use_master_key() {
    if [ -z "${APP__MASTER_KEY:-}" ]; then
        if [ ! -s "$DATA_DIR/master.key" ]; then
            mkdir -p "$DATA_DIR"
            (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$DATA_DIR/master.key")
        fi
        APP__MASTER_KEY="$(cat "$DATA_DIR/master.key")"
        export APP__MASTER_KEY
    fi
}

# stop_platform: stops the platform process that scripts/start or scripts/start-ha ran (its id
# in DATA_DIR/platform.pid) with SIGTERM, so that it finishes what is in flight; waits up to
# 10 s for it to end.
stop_platform() {
    local pid
    [ -f "$DATA_DIR/platform.pid" ] || return 0
    pid="$(cat "$DATA_DIR/platform.pid")"
    # Only the platform binary that was run under this id (not a process that took the id since).
    if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "platform --workspace"; then
        kill -TERM "$pid"
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -f "$DATA_DIR/platform.pid"
}
