# Shell functions for a private PostgreSQL cluster (sourced by scripts/start and scripts/test).
# Installs Debian's postgresql when its binaries are missing; runs initdb as the postgres
# user when we are root (initdb refuses to run as root).

pg_bindir() {
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

ensure_postgres() {
    if [ -z "$(pg_bindir)" ] || [ ! -x "$(pg_bindir)/initdb" ]; then
        echo "PostgreSQL binaries are missing; installing Debian's postgresql" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq postgresql >/dev/null
    fi
    PG_BIN="$(pg_bindir)"
    export PG_BIN
}

# Runs a command as the cluster's owner.
as_pg_owner() {
    if [ "$(id -u)" = 0 ]; then
        # From / so that postgres is not left in a directory it may not enter.
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

# pg_data_dir DATA_DIR: creates the folder for a cluster, owned by the cluster's owner.
pg_data_dir() {
    local data_dir="$1"
    mkdir -p "$data_dir"
    if [ "$(id -u)" = 0 ]; then
        chown postgres:postgres "$data_dir"
        chmod 700 "$data_dir"
        # postgres must be able to reach the directory through its parents.
        local parent
        parent="$(dirname "$data_dir")"
        while [ "$parent" != "/" ]; do
            chmod o+x "$parent" 2>/dev/null || true
            parent="$(dirname "$parent")"
        done
    fi
}

# pg_start DATA_DIR PORT [extra server options]: initialise (once) and start a cluster that
# listens on 127.0.0.1:PORT and a socket in DATA_DIR.
pg_start() {
    local data_dir="$1" port="$2"
    shift 2
    ensure_postgres
    pg_data_dir "$data_dir"
    if [ ! -f "$data_dir/PG_VERSION" ]; then
        as_pg_owner "$PG_BIN/initdb" -D "$data_dir" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    fi
    pg_run "$data_dir" "$port" "$@"
}

# pg_start_replica PRIMARY_PORT DATA_DIR PORT [extra server options]: a hot standby of the
# cluster on PRIMARY_PORT (physical streaming replication: pg_basebackup -R writes the
# connection to the primary and standby.signal), listening on 127.0.0.1:PORT.
pg_start_replica() {
    local primary="$1" data_dir="$2" port="$3"
    shift 3
    ensure_postgres
    pg_data_dir "$data_dir"
    if [ ! -f "$data_dir/PG_VERSION" ]; then
        as_pg_owner "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$primary" -U postgres -D "$data_dir" \
            -R -X stream -c fast >/dev/null
    fi
    pg_run "$data_dir" "$port" "$@"
}

# pg_run DATA_DIR PORT [extra server options]: starts the cluster in DATA_DIR unless it runs.
pg_run() {
    local data_dir="$1" port="$2"
    shift 2
    if as_pg_owner "$PG_BIN/pg_ctl" -D "$data_dir" status >/dev/null 2>&1; then
        return 0
    fi
    if ! as_pg_owner "$PG_BIN/pg_ctl" -D "$data_dir" -l "$data_dir/server.log" -w -t 60 \
        -o "-p $port -k $data_dir -c listen_addresses=127.0.0.1 -c max_connections=400 $*" start >/dev/null; then
        echo "PostgreSQL did not start on port $port; its log ends with:" >&2
        tail -n 20 "$data_dir/server.log" >&2 || true
        return 1
    fi
}

pg_stop() {
    local data_dir="$1"
    as_pg_owner "$PG_BIN/pg_ctl" -D "$data_dir" -m fast -w stop >/dev/null 2>&1 || true
}

# psql against the cluster as the postgres superuser.
pg_psql() {
    local port="$1"
    shift
    "$PG_BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -v ON_ERROR_STOP=1 -q "$@"
}
