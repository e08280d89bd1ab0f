# Shell functions for the HA deployment of PostgreSQL on one machine (sourced by
# scripts/start-ha and the fault harness): pg_auto_failover's monitor (the third voter) and
# data nodes, each server in a network namespace of its own on a private bridge, so that a
# node can be cut off from everyone (its link taken down: packets to and from it vanish, as on
# a real network) or killed for good (every process of its namespace killed with SIGKILL), and
# so that two deployments on one machine never share a port.
#
# Settings (environment):
#   HA_DIR     the folder of the monitor's and the nodes' data (required)
#   HA_INDEX   0..250: picks the subnet 10.231.HA_INDEX.0/24 and the interface names, so that
#              two deployments on one machine do not meet (default 0)
#
# Addresses: the bridge is 10.231.I.1 in the machine's own namespace (where the services run);
# the monitor listens on 10.231.I.2:5430 in the namespace pha<I>nm, data node N on
# 10.231.I.(10+N):(5430+N) in the namespace pha<I>n<N>. The ports
# differ because the servers' sockets share a folder, HA_DIR/sockets (a new node copies its
# settings from the primary); the monitor has a second socket in its data folder, where
# pg_autoctl looks while it creates the monitor.
# Needs root (namespaces, links); PostgreSQL and pg_autoctl run as the postgres user.

HA_INDEX="${HA_INDEX:-0}"
ha_prefix() { echo "pha${HA_INDEX}"; }
ha_bridge() { echo "$(ha_prefix)br"; }
ha_netns() { echo "$(ha_prefix)n$1"; }
ha_subnet() { echo "10.231.${HA_INDEX}"; }
ha_bridge_host() { echo "$(ha_subnet).1"; }
ha_monitor_host() { echo "$(ha_subnet).2"; }
# ha_node_host N: node N's address (N = m: the monitor's).
ha_node_host() {
    if [ "$1" = m ]; then ha_monitor_host; else echo "$(ha_subnet).$((10 + $1))"; fi
}
# ha_port [N]: the monitor's port (no N) or node N's.
ha_port() { echo "$((5430 + ${1:-0}))"; }
# The monitor's URI as the keepers use it. pg_autoctl 2.0 (Debian's) hands it to libpq as it
# is and sets no timeout on an open connection, so a keeper whose call to the monitor was under
# way when its network went silent waited until the network came back, and its primary, cut
# off, never demoted itself (the fault harness's check of the order caught it). The URI bounds
# that: data unacknowledged for 2 s (libpq's tcp_user_timeout is in milliseconds), or an idle
# connection silent for 1 + 2 x 1 s, fails the call, and the keeper goes on to its partition
# check.
HA_MONITOR_TIMEOUTS="tcp_user_timeout=2000&keepalives=1&keepalives_idle=1&keepalives_interval=1&keepalives_count=2"
ha_monitor_uri() {
    echo "postgres://autoctl_node@$(ha_monitor_host):$(ha_port)/pg_auto_failover?sslmode=disable&$HA_MONITOR_TIMEOUTS"
}

# How quickly the monitor and the keepers act (docs/operations.md, "Timings"). A primary cut
# off from the monitor and from its standby demotes itself once it has heard from neither for
# more than HA_PARTITION_TIMEOUT seconds (whole seconds: 1 to 2), counted for the standby from
# the last check at which its keeper still saw the walsender (wal_sender_timeout below); the
# keeper checks after each failed call to the monitor, about every 2 s, so it is down some 3
# to 5 s after the cut. The monitor starts a failover once a node has not reported for
# HA_UNHEALTHY_MS and failed its health check (2.5 to 3.5 s after the cut), and promotes the
# standby of an unreachable primary only HA_DEMOTE_MS later: about 7 s after the cut, so the
# old primary is down first (the fault harness checks it after every cut).
HA_HEALTH_PERIOD_MS="${HA_HEALTH_PERIOD_MS:-1000}"
HA_HEALTH_TIMEOUT_MS="${HA_HEALTH_TIMEOUT_MS:-1000}"
HA_UNHEALTHY_MS="${HA_UNHEALTHY_MS:-2500}"
HA_DEMOTE_MS="${HA_DEMOTE_MS:-4000}"
HA_PARTITION_TIMEOUT="${HA_PARTITION_TIMEOUT:-1}"

# The server settings every data node runs with (pg_auto_failover adds its own): a walsender
# gives up a silent standby after 3 s, and a walreceiver a silent primary after 5 s (the
# default, 60 s, would keep a cut-off primary believing its standby is there, so its keeper
# would not demote it). A keeper counts its standby's silence only from a check at which it
# could not reach the monitor and still saw the walsender, and its first check after a cut
# can come 2 s after it (a call under way on an open connection fails by its keepalives): at
# 2 s the walsender was gone by then under load, and that primary never demoted itself. The
# walsender asks for a reply after half its timeout, and a standby answers at once (a
# synchronous one replies to every flush anyway), so 3 s cuts only a standby that is gone.
#
# A new node starts from a base backup, which begins at a checkpoint that pg_autoctl does not
# ask to be fast: it waits for a spread one, up to checkpoint_completion_target x
# checkpoint_timeout (4.5 min with PostgreSQL's defaults). HA_CHECKPOINT_TIMEOUT (1min by
# default) bounds how long a replacement server waits for its copy, at the cost of more
# frequent checkpoints.
HA_CHECKPOINT_TIMEOUT="${HA_CHECKPOINT_TIMEOUT:-1min}"
HA_NODE_SETTINGS="
wal_sender_timeout = '3s'
wal_receiver_timeout = '5s'
max_connections = 400
wal_writer_delay = '10ms'
checkpoint_timeout = '$HA_CHECKPOINT_TIMEOUT'
checkpoint_completion_target = 0.5
"

# Runs a command as postgres inside node N's namespace (N = m: the monitor's), with
# pg_autoctl's files (configuration, state, base backups) kept under HA_DIR.
ha_as_pg() {
    local node="$1"
    shift
    (cd / && ip netns exec "$(ha_netns "$node")" runuser -u postgres -- \
        env XDG_CONFIG_HOME="$HA_DIR/pg_autoctl/config" XDG_DATA_HOME="$HA_DIR/pg_autoctl/data" "$@")
}

# HA_DIR, owned by postgres (pg_autoctl keeps a new node's base backup beside its data).
ha_dir() {
    pg_data_dir "$HA_DIR"
    chmod 755 "$HA_DIR"
    mkdir -p "$HA_DIR/sockets"
    chown postgres:postgres "$HA_DIR/sockets"
}

ha_network_up() {
    local bridge
    bridge="$(ha_bridge)"
    if ! ip link show "$bridge" >/dev/null 2>&1; then
        ip link add "$bridge" type bridge
        ip addr add "$(ha_bridge_host)/24" dev "$bridge"
        ip link set "$bridge" up
    fi
}

# ha_node_network N: node N's namespace (N = m: the monitor's) and its link to the bridge
# (eth0 inside).
ha_node_network() {
    local node="$1" netns host_link
    netns="$(ha_netns "$node")"
    host_link="$(ha_prefix)h$node"
    if ! ip netns list | grep -qw "$netns"; then
        ip netns add "$netns"
    fi
    if ! ip netns exec "$netns" ip link show eth0 >/dev/null 2>&1; then
        # A link left from a namespace that was removed while its processes were dying.
        ip link del "$host_link" 2>/dev/null || true
        ip link add "$host_link" type veth peer name "$(ha_prefix)v$node"
        ip link set "$(ha_prefix)v$node" netns "$netns"
        ip netns exec "$netns" ip link set "$(ha_prefix)v$node" name eth0
        ip link set "$host_link" master "$(ha_bridge)"
        ip link set "$host_link" up
        ip netns exec "$netns" ip addr add "$(ha_node_host "$node")/24" dev eth0
        ip netns exec "$netns" ip link set lo up
    fi
    ip netns exec "$netns" ip link set eth0 up
}

ha_monitor_start() {
    local dir="$HA_DIR/monitor"
    ensure_postgres
    ha_dir
    ha_network_up
    ha_node_network m
    pg_data_dir "$dir"
    if [ ! -f "$dir/PG_VERSION" ]; then
        ha_as_pg m "$PG_BIN/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
        printf 'host all all %s.0/24 trust\nhost all all 127.0.0.1/32 trust\n' "$(ha_subnet)" >>"$dir/pg_hba.conf"
        {
            echo "unix_socket_directories = '$HA_DIR/sockets, .'"
            echo "pgautofailover.health_check_period = $HA_HEALTH_PERIOD_MS"
            echo "pgautofailover.health_check_timeout = $HA_HEALTH_TIMEOUT_MS"
            echo "pgautofailover.health_check_max_retries = 1"
            echo "pgautofailover.health_check_retry_delay = 500"
            echo "pgautofailover.node_considered_unhealthy_timeout = $HA_UNHEALTHY_MS"
            echo "pgautofailover.primary_demote_timeout = $HA_DEMOTE_MS"
        } >>"$dir/postgresql.conf"
        if ! ha_as_pg m env PGHOST="$dir" pg_autoctl create monitor --pgdata "$dir" \
            --pgport "$(ha_port)" --pgctl "$PG_BIN/pg_ctl" --hostname "$(ha_monitor_host)" --no-ssl \
            --skip-pg-hba >"$HA_DIR/monitor.create.log" 2>&1; then
            echo "the monitor was not created; its log ends with:" >&2
            tail -n 20 "$HA_DIR/monitor.create.log" >&2
            return 1
        fi
    fi
    if ! ha_monitor_sql "SELECT 1" >/dev/null; then
        ha_as_pg m env PGHOST="$dir" nohup pg_autoctl run --pgdata "$dir" >>"$HA_DIR/monitor.log" 2>&1 &
    fi
    ha_wait_sql "$(ha_monitor_host)" "$(ha_port)" "SELECT 1" pg_auto_failover
}

# ha_wait_sql HOST PORT SQL [DBNAME]: waits (60 s at most) until SQL answers on HOST:PORT.
ha_wait_sql() {
    local host="$1" port="$2" sql="$3" dbname="${4:-postgres}"
    for _ in $(seq 1 300); do
        if "$PG_BIN/psql" -h "$host" -p "$port" -U postgres -d "$dbname" -Atqc "$sql" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.2
    done
    echo "$host:$port did not answer within 60 s" >&2
    return 1
}

# ha_node_start N: creates data node N (the first one initialises the database; later ones
# copy the primary with pg_basebackup once they run) or starts it again on its data; returns
# once its keeper runs.
ha_node_start() {
    local node="$1" dir="$HA_DIR/node$1" host
    host="$(ha_node_host "$node")"
    ha_dir
    ha_node_network "$node"
    if ha_node_running "$node"; then
        return 0
    fi
    pg_data_dir "$dir"
    if [ ! -f "$HA_DIR/node$node.created" ]; then
        if [ ! -f "$dir/PG_VERSION" ] && ! ha_has_primary; then
            # The first node: our own initdb, so that the rules for connections and the settings
            # are in place before anyone connects (a later node copies them with the primary).
            ha_as_pg "$node" "$PG_BIN/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
            printf 'host all all %s.0/24 trust\nhost replication all %s.0/24 trust\n' \
                "$(ha_subnet)" "$(ha_subnet)" >>"$dir/pg_hba.conf"
            printf '%s' "$HA_NODE_SETTINGS" >>"$dir/postgresql.conf"
            # Not in the data folder: pg_rewind copies every file of the new primary's.
            echo "unix_socket_directories = '$HA_DIR/sockets'" >>"$dir/postgresql.conf"
        fi
        # Registers the node (the first as primary, a later one as a standby that copies the
        # primary once it runs).
        if ! ha_as_pg "$node" env PGHOST="$HA_DIR/sockets" pg_autoctl create postgres --pgdata "$dir" \
            --pgport "$(ha_port "$node")" --pgctl "$PG_BIN/pg_ctl" --listen "$host" --hostname "$host" \
            --name "node$node" --monitor "$(ha_monitor_uri)" --no-ssl --skip-pg-hba \
            >>"$HA_DIR/node$node.log" 2>&1; then
            echo "node $node was not created; its log ends with:" >&2
            tail -n 20 "$HA_DIR/node$node.log" >&2
            return 1
        fi
        # (Beside the data folder: pg_rewind copies every file of it and would trip on ours.)
        touch "$HA_DIR/node$node.created"
    fi
    # The keeper's own settings, at every start, so that a deployment created by an earlier
    # version gets them too: its timeout of a network partition, and the monitor's URI with
    # its connection timeouts.
    ha_as_pg "$node" pg_autoctl config set --pgdata "$dir" timeout.network_partition_timeout \
        "$HA_PARTITION_TIMEOUT" >/dev/null
    ha_as_pg "$node" pg_autoctl config set --pgdata "$dir" pg_autoctl.monitor "$(ha_monitor_uri)" >/dev/null
    ha_as_pg "$node" env PGHOST="$HA_DIR/sockets" nohup pg_autoctl run --pgdata "$dir" >>"$HA_DIR/node$node.log" 2>&1 &
}

ha_monitor_sql() {
    "$PG_BIN/psql" -h "$(ha_monitor_host)" -p "$(ha_port)" -U postgres -d pg_auto_failover -Atqc "$1" 2>/dev/null
}

# Whether the monitor knows a primary.
ha_has_primary() {
    [ -n "$(ha_monitor_sql "SELECT nodename FROM pgautofailover.node
        WHERE reportedstate IN ('single', 'primary', 'wait_primary') LIMIT 1")" ]
}

# The nodes as the monitor sees them: name, reported state, goal state.
ha_state() {
    ha_monitor_sql "SELECT nodename || ' ' || reportedstate || ' ' || goalstate FROM pgautofailover.node ORDER BY nodeid"
}

# ha_wait_healthy [N]: waits until N nodes (default 2) are one primary and its secondaries,
# and every secondary streams from the primary. The monitor's states alone are not enough: a
# standby reports `secondary` before it streams from a new primary, and until one does, the
# primary's keeper would never stop it if it were cut off (pg_autoctl counts the silence of a
# standby only once it has seen one while it could not reach the monitor; docs/operations.md,
# "Timings").
ha_wait_healthy() {
    local want="${1:-2}" state primary streaming
    for _ in $(seq 1 600); do
        state="$(ha_monitor_sql "SELECT count(*) FILTER (WHERE reportedstate = 'primary' AND goalstate = 'primary')
            || ' ' || count(*) FILTER (WHERE reportedstate = 'secondary' AND goalstate = 'secondary')
            FROM pgautofailover.node")"
        if [ "$state" = "1 $((want - 1))" ]; then
            primary="$(ha_monitor_sql "SELECT nodehost || ' ' || nodeport FROM pgautofailover.node
                WHERE reportedstate = 'primary' LIMIT 1")"
            streaming="$(ha_host_sql "${primary% *}" "${primary#* }" \
                -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'" 2>/dev/null || true)"
            if [ "$streaming" = "$((want - 1))" ]; then
                return 0
            fi
        fi
        sleep 0.2
    done
    echo "the formation did not become healthy within 120 s:" >&2
    ha_state >&2
    return 1
}

# ha_database_url N...: the connection string of the formation's nodes N...: the services
# try each in turn and keep the one that takes writes.
ha_database_url() {
    local hosts="" ports="" node
    for node in "$@"; do
        hosts="${hosts:+$hosts,}$(ha_node_host "$node")"
        ports="${ports:+$ports,}$(ha_port "$node")"
    done
    echo "host=$hosts port=$ports user=postgres dbname=platform target_session_attrs=read-write"
}

# ha_node_kill N: the machine of node N dies: every process in its namespace, SIGKILL.
ha_node_kill() {
    local pids
    pids="$(ip netns pids "$(ha_netns "$1")" 2>/dev/null || true)"
    if [ -n "$pids" ]; then
        # shellcheck disable=SC2086
        kill -9 $pids 2>/dev/null || true
    fi
}

# ha_node_cut N / ha_node_heal N: node N's link down (nothing in or out) and up again.
ha_node_cut() { ip netns exec "$(ha_netns "$1")" ip link set eth0 down; }
ha_node_heal() { ip netns exec "$(ha_netns "$1")" ip link set eth0 up; }

# ha_node_drop N: removes node N from the monitor (a server lost for good) and its data.
ha_node_drop() {
    ha_as_pg m pg_autoctl drop node --monitor "$(ha_monitor_uri)" --formation default --name "node$1" --force \
        >>"$HA_DIR/drop.log" 2>&1 || true
    local dir="$HA_DIR/node$1"
    rm -rf "$dir" "$HA_DIR/node$1.created" "$HA_DIR/pg_autoctl/config/pg_autoctl$dir" \
        "$HA_DIR/pg_autoctl/data/pg_autoctl$dir"
}

# A planned switchover: the monitor makes the secondary primary and the primary its standby;
# returns once the formation is healthy again. (pg_autoctl's own --wait fails on 2.0: it asks
# the monitor for a group named '', so we wait on the monitor's state ourselves.)
#
# The primary is fenced first. pg_auto_failover 2.0's monitor can send a primary it has just
# told to drain to `wait_primary` instead, the moment its standby leaves `secondary` for the
# promotion ("none of the standby nodes in the quorum are healthy"; upstream issue #774, fixed
# after 2.2): the old primary's keeper then empties `synchronous_standby_names`, cancels the
# commits waiting for the standby, and takes writes alone for the seconds until the demote
# timeout, while the standby is promoted. Those writes are acknowledged and lost when the old
# primary is rewound (the HA fault harness lost 6% of a run's writes that way). So before the
# switchover the primary takes no more writes (`default_transaction_read_only`, which the
# services' `target_session_attrs=read-write` also reads; a write in flight answers 503 and is
# retried), the transactions begun before that end (those still open after 2 s are ended), and
# the standby has flushed everything; the fence is lifted on the old primary once it is a
# standby again (a promotion lifts it on the new one).
ha_switchover() {
    local fenced
    fenced="$(ha_fence_primary)" || return 1
    # shellcheck disable=SC2086
    if ! ha_as_pg m pg_autoctl perform switchover --monitor "$(ha_monitor_uri)" --formation default --group 0 --wait 0; then
        # Refused (the formation was not stable): the primary takes writes again.
        ha_unfence $fenced
        return 1
    fi
    ha_wait_healthy "$(ha_monitor_sql "SELECT count(*) FROM pgautofailover.node")"
    # shellcheck disable=SC2086
    ha_unfence $fenced
}

# ha_fence_primary: the primary takes no more writes, its transactions begun before that have
# ended, and its standbys have flushed everything (ha_switchover); prints its host and port.
ha_fence_primary() {
    local primary host port fenced
    primary="$(ha_monitor_sql "SELECT nodehost || ' ' || nodeport FROM pgautofailover.node
        WHERE reportedstate = 'primary' AND goalstate = 'primary' LIMIT 1")"
    if [ -z "$primary" ]; then
        echo "no primary to fence:" >&2
        ha_state >&2
        return 1
    fi
    host="${primary% *}"
    port="${primary#* }"
    ha_host_sql "$host" "$port" -c "ALTER SYSTEM SET default_transaction_read_only = on" -c "SELECT pg_reload_conf()" >/dev/null
    # The postmaster reads the file again and signals its backends; each takes the setting
    # before its next command, so every transaction begun from then on is read-only.
    ha_wait_setting "$host" "$port" on
    fenced="$(ha_host_sql "$host" "$port" -c "SELECT now()")"
    for _ in $(seq 1 20); do
        [ "$(ha_host_sql "$host" "$port" -c "SELECT count(*) FROM pg_stat_activity
            WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND xact_start < '$fenced'")" = 0 ] && break
        sleep 0.1
    done
    ha_host_sql "$host" "$port" -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
        WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND xact_start < '$fenced'" >/dev/null
    for _ in $(seq 1 100); do
        [ "$(ha_host_sql "$host" "$port" -c "SELECT COALESCE(bool_and(flush_lsn >= pg_current_wal_lsn()), false)
            FROM pg_stat_replication")" = t ] && break
        sleep 0.1
    done
    echo "$host $port"
}

# ha_unfence HOST PORT: the server there takes writes again when it is a primary.
ha_unfence() {
    ha_host_sql "$1" "$2" -c "ALTER SYSTEM RESET default_transaction_read_only" -c "SELECT pg_reload_conf()" >/dev/null
    ha_wait_setting "$1" "$2" off
}

# ha_wait_setting HOST PORT VALUE: waits (5 s at most) until a new session there has
# `default_transaction_read_only` at VALUE: pg_reload_conf() only signals the postmaster, and a
# session it starts before it has read the file again has the old value.
ha_wait_setting() {
    for _ in $(seq 1 50); do
        [ "$(ha_host_sql "$1" "$2" -c "SHOW default_transaction_read_only")" = "$3" ] && return 0
        sleep 0.1
    done
    echo "default_transaction_read_only on $1:$2 is not $3 after 5 s" >&2
    return 1
}

# ha_host_sql HOST PORT ARGS...: psql on a data node's `postgres` database.
ha_host_sql() {
    local host="$1" port="$2"
    shift 2
    "$PG_BIN/psql" -h "$host" -p "$port" -U postgres -d postgres -Atq "$@"
}

# ha_down: kills every node and the monitor (every process of their namespaces) and removes
# the namespaces and the bridge.
ha_down() {
    local netns pids
    for netns in $(ip netns list | awk '{print $1}' | grep "^$(ha_prefix)n" || true); do
        pids="$(ip netns pids "$netns" 2>/dev/null || true)"
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill -9 $pids 2>/dev/null || true
        fi
        ip netns del "$netns" 2>/dev/null || true
        ip link del "$(ha_prefix)h${netns#"$(ha_prefix)n"}" 2>/dev/null || true
    done
    ip link del "$(ha_bridge)" 2>/dev/null || true
}

# ha_stop: stops the nodes, then the monitor, cleanly (scripts/stop-ha); their data stays and
# scripts/start-ha starts them again.
ha_stop() {
    local dir
    for dir in "$HA_DIR"/node*; do
        [ -f "$dir.created" ] || continue
        local node="${dir##*/node}"
        ha_as_pg "$node" pg_autoctl stop --pgdata "$dir" >/dev/null 2>&1 || true
    done
    [ -d "$HA_DIR/monitor" ] && ha_as_pg m pg_autoctl stop --pgdata "$HA_DIR/monitor" >/dev/null 2>&1 || true
}

# ha_node_running N: whether node N's pg_autoctl runs.
ha_node_running() {
    ip netns pids "$(ha_netns "$1")" 2>/dev/null | grep -q .
}

# ensure_auto_failover: Debian's pg_auto_failover (pg_autoctl and the monitor's extension) for
# the installed PostgreSQL, installed when missing.
ensure_auto_failover() {
    ensure_postgres
    local major
    major="$(basename "$(dirname "$PG_BIN")")"
    if ! command -v pg_autoctl >/dev/null 2>&1 \
        || [ ! -f "/usr/share/postgresql/$major/extension/pgautofailover.control" ]; then
        echo "pg_auto_failover is missing; installing Debian's pg-auto-failover-cli and postgresql-$major-auto-failover" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq pg-auto-failover-cli "postgresql-$major-auto-failover" >/dev/null
    fi
}
