//! The HA deployment of PostgreSQL for the tests: pg_auto_failover's monitor and data nodes,
//! each node in a network namespace of its own (scripts/ha.sh, the same functions
//! scripts/start-ha uses), so that a test can kill a node's machine for good, cut it off from
//! the network, or ask the monitor for a switchover.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::helpers::{create_migrated_platform, scratch_dir};

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts");

/// A monitor and data nodes 1..=nodes, torn down (every process killed, namespaces and data
/// removed) when dropped.
pub(crate) struct HaCluster {
    dir: PathBuf,
    index: u8,
    nodes: Vec<u32>,
}

impl HaCluster {
    /// Starts the monitor and `nodes` data nodes and waits until they are one primary and its
    /// standbys. The subnet is chosen at random, so that it does not meet a deployment of
    /// scripts/start-ha (index 0) on the same machine.
    pub(crate) fn start(nodes: u32) -> HaCluster {
        let index = 1 + (rand::random::<u8>() % 240);
        let cluster = HaCluster { dir: scratch_dir("ha"), index, nodes: (1..=nodes).collect() };
        cluster.run("ha_down; ha_monitor_start");
        for node in 1..=nodes {
            cluster.run(&format!("ha_node_start {node}"));
            if node == 1 {
                cluster.run("for _ in $(seq 1 300); do ha_has_primary && exit 0; sleep 0.2; done; ha_state; exit 1");
            }
        }
        cluster.wait_healthy();
        cluster
    }

    /// Runs `script` in bash with scripts/pg.sh and scripts/ha.sh sourced; panics (with the
    /// output and the formation's state) when it fails.
    fn run(&self, script: &str) -> Output {
        let output = self.bash(script);
        if !output.status.success() {
            let state = self.bash("ha_state; tail -n 30 \"$HA_DIR\"/*.log");
            panic!(
                "{script}: {}\n{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                String::from_utf8_lossy(&state.stdout)
            );
        }
        output
    }

    fn bash(&self, script: &str) -> Output {
        Command::new("bash")
            .arg("-c")
            .arg(format!("set -eu; source {SCRIPTS}/pg.sh; source {SCRIPTS}/ha.sh; ensure_postgres; {script}"))
            .env("HA_DIR", &self.dir)
            .env("HA_INDEX", self.index.to_string())
            // A replacement server's base backup waits for a checkpoint: at most 15 s here.
            .env("HA_CHECKPOINT_TIMEOUT", "30s")
            .output()
            .expect("bash runs")
    }

    /// The connection string of database `dbname` on whichever node takes writes.
    pub(crate) fn url(&self, dbname: &str) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(u32::to_string).collect();
        let output = self.run(&format!("ha_database_url {}", nodes.join(" ")));
        String::from_utf8_lossy(&output.stdout).trim().replace("dbname=platform", &format!("dbname={dbname}"))
    }

    /// The connection string of the `platform` database on whichever node is a standby.
    pub(crate) fn read_url(&self) -> String {
        self.url("platform").replace("target_session_attrs=read-write", "target_session_attrs=read-only")
    }

    /// The node the monitor names primary (also while it waits for a standby), if any.
    pub(crate) fn primary(&self) -> Option<u32> {
        let output = self.bash(
            "ha_monitor_sql \"SELECT nodename FROM pgautofailover.node
               WHERE reportedstate IN ('primary', 'wait_primary', 'single')
                 AND goalstate IN ('primary', 'wait_primary', 'single') LIMIT 1\"",
        );
        String::from_utf8_lossy(&output.stdout).trim().strip_prefix("node").and_then(|n| n.parse().ok())
    }

    /// The formation as the monitor sees it, one node per line.
    pub(crate) fn state(&self) -> String {
        String::from_utf8_lossy(&self.bash("ha_state").stdout).trim().replace('\n', "; ")
    }

    /// Waits until the nodes are one primary and its standbys.
    pub(crate) fn wait_healthy(&self) {
        self.run(&format!("ha_wait_healthy {}", self.nodes.len()));
    }

    /// The machine of `node` dies: every process of its namespace, SIGKILL.
    pub(crate) fn kill(&self, node: u32) {
        self.run(&format!("ha_node_kill {node}"));
    }

    /// `node`'s link down: packets to and from it are lost until [`HaCluster::heal`].
    pub(crate) fn cut(&self, node: u32) {
        self.run(&format!("ha_node_cut {node}"));
    }

    pub(crate) fn heal(&self, node: u32) {
        self.run(&format!("ha_node_heal {node}"));
    }

    /// How long before the monitor let another node take writes (`wait_primary` once the demote
    /// timeout expired, in its events) `node`, cut off while primary at `cut_at` (the time of
    /// day, `HH:MM:SS`), had stopped its PostgreSQL (its keeper's move to `demote_timeout`, in
    /// its log), in whole seconds (both logs have one-second times).
    ///
    /// A keeper whose first look after the cut found no standby never stops its primary
    /// (pg_autoctl counts a standby's silence only from a look that saw one; docs/operations.md,
    /// "Timings", says when): that is [`CutPrimary::StayedUp`], with the look. What is missing
    /// otherwise is an error.
    pub(crate) fn stopped_before_promotion(&self, node: u32, cut_at: &str) -> Result<CutPrimary, String> {
        let output = self.run(&format!(
            r#"echo "stopped $(grep -a 'Transition complete: current state is now "demote_timeout"' "$HA_DIR/node{node}.log" | tail -n 1 | cut -c1-8)"
               echo "promoted $(ha_monitor_sql "SELECT to_char(eventtime, 'HH24:MI:SS') FROM pgautofailover.event
                 WHERE description LIKE '%to wait_primary and %after the demote timeout expired%'
                 ORDER BY eventid DESC LIMIT 1")"
               echo "first look $(grep -a 'Network is healthy\|Network in not healthy\|still have a standby' "$HA_DIR/node{node}.log" \
                 | awk -v cut='{cut_at}' 'substr($0, 1, 8) >= cut' | head -n 1)"
               echo "what node{node}'s keeper said of it:"
               grep -a -i 'partition\|standby\|transition\|demote\|network\|monitor' "$HA_DIR/node{node}.log" | tail -n 80"#
        ));
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        let line_of = |label: &str| text.lines().find_map(|line| line.strip_prefix(label)).map(str::trim);
        let time_of = |label: &str| -> Option<i64> {
            let parts: Vec<i64> = line_of(label)?.split(':').map(str::parse).collect::<Result<_, _>>().ok()?;
            match parts[..] {
                [hours, minutes, seconds] => Some(hours * 3600 + minutes * 60 + seconds),
                _ => None,
            }
        };
        let stopped = time_of("stopped ").filter(|stopped| {
            // A demotion of an earlier cut is not this one's.
            let cut: Vec<i64> = cut_at.split(':').filter_map(|part| part.parse().ok()).collect();
            cut.len() == 3 && (*stopped - (cut[0] * 3600 + cut[1] * 60 + cut[2])).rem_euclid(86_400) < 43_200
        });
        let Some(stopped) = stopped else {
            let look = line_of("first look ").unwrap_or_default();
            // A look that saw a standby logs that it still has one before "Network is healthy";
            // one that found none logs only "Network is healthy" and counts no partition.
            if look.ends_with("Network is healthy") {
                return Ok(CutPrimary::StayedUp(look.to_owned()));
            }
            return Err(format!("node{node} never demoted itself:\n{text}"));
        };
        let promoted = time_of("promoted ").ok_or_else(|| format!("no promotion after a demote timeout:\n{text}"))?;
        // Across midnight, the times of day wrap.
        let gap = (promoted - stopped).rem_euclid(86_400);
        Ok(CutPrimary::Stopped(if gap > 43_200 { gap - 86_400 } else { gap }))
    }

    /// The monitor's events, each at its second after `epoch` (seconds since 1970): its goal
    /// states and what the keepers reported.
    pub(crate) fn events(&self, epoch: f64) -> String {
        let output = self.bash(&format!(
            "ha_monitor_sql \"SELECT to_char(extract(epoch FROM eventtime) - {epoch}, 'FM9990.0') || ' s: ' || nodename
               || ' ' || reportedstate || '/' || goalstate || ' ' || COALESCE(reportedrepstate, '-')
               || ' tli ' || reportedtli || ' lsn ' || reportedlsn || ': ' || description
               FROM pgautofailover.event ORDER BY eventid\""
        ));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Starts watching what each node's server says it is, every 100 ms: see [`RoleWatch`].
    pub(crate) fn watch_roles(&self) -> RoleWatch {
        // Each node's address and port, as scripts/ha.sh gives them.
        let nodes: Vec<(u32, String)> = self
            .nodes
            .iter()
            .map(|node| {
                let output = self.run(&format!("echo \"host=$(ha_node_host {node}) port=$(ha_port {node})\""));
                let address = String::from_utf8_lossy(&output.stdout).trim().to_owned();
                (*node, format!("{address} user=postgres dbname=postgres connect_timeout=1"))
            })
            .collect();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let seen = Arc::clone(&seen);
            async move {
                let mut last: HashMap<u32, String> = HashMap::new();
                let mut clients: HashMap<u32, tokio_postgres::Client> = HashMap::new();
                loop {
                    for (node, url) in &nodes {
                        let said = role_of(&mut clients, *node, url).await;
                        if last.get(node) != Some(&said) {
                            seen.lock().expect("the watch's lock").push((Instant::now(), format!("node{node} {said}")));
                            last.insert(*node, said);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        RoleWatch { seen, task }
    }

    /// A lost server replaced, as docs/operations.md says: once another node has taken over
    /// (dropping a lost primary before that would make a standby that had fallen behind the only
    /// server, with what it had), dropped from the monitor, and a new server (here on the same
    /// address) created from a base backup of the primary.
    pub(crate) fn replace(&self, node: u32) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.primary().is_none_or(|primary| primary == node) {
            assert!(Instant::now() < deadline, "no node took over from node{node} within 60 s: {}", self.state());
            std::thread::sleep(Duration::from_millis(200));
        }
        self.run(&format!("ha_node_kill {node}; ha_node_drop {node}; ha_node_start {node}"));
    }

    /// A planned switchover, as the operator runs it; returns once it is done.
    pub(crate) fn switchover(&self) {
        self.run("ha_switchover >/dev/null");
    }

    /// Fences the primary as [`HaCluster::switchover`] does before asking the monitor: its host
    /// and port.
    fn fence_primary(&self) -> (String, u16) {
        let output = self.run("ha_fence_primary");
        let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        let (host, port) = text.split_once(' ').expect("the fenced primary's host and port");
        (host.to_owned(), port.parse().expect("its port"))
    }

    fn unfence(&self, (host, port): &(String, u16)) {
        self.run(&format!("ha_unfence {host} {port}"));
    }

    /// The `platform` database, created on the primary and migrated: its URL.
    pub(crate) async fn migrated_platform(&self) -> String {
        create_migrated_platform(&self.url("postgres"), &self.url("platform")).await
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        let _ = self.bash("ha_down");
        // After a failure the logs stay, for the reader.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// What each node's server said it was, whenever that changed: a standby or a primary, whether
/// it takes writes, and whom it waits for at a commit (`synchronous_standby_names`), or that it
/// did not answer. Two servers that take writes at once, or a primary that acknowledges alone,
/// show here at the moment they did.
pub(crate) struct RoleWatch {
    seen: Arc<Mutex<Vec<(Instant, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RoleWatch {
    /// Every change seen, each at its time since `started` (the faults' clock).
    pub(crate) async fn finish(self, started: Instant) -> String {
        self.task.abort();
        let _ = self.task.await;
        let seen = self.seen.lock().expect("the watch's lock");
        let lines: Vec<String> = seen
            .iter()
            .map(|(at, said)| {
                let at = if *at >= started {
                    at.duration_since(started).as_secs_f64()
                } else {
                    -started.duration_since(*at).as_secs_f64()
                };
                format!("{at:.1} s: {said}")
            })
            .collect();
        lines.join("\n")
    }
}

/// What the server of `node` says it is, over the kept connection (a new one when there is
/// none or it failed).
async fn role_of(clients: &mut HashMap<u32, tokio_postgres::Client>, node: u32, url: &str) -> String {
    const SQL: &str = "SELECT CASE WHEN pg_is_in_recovery() THEN 'standby' ELSE 'primary' END
        || CASE WHEN current_setting('default_transaction_read_only') = 'on' THEN ' read-only' ELSE ' read-write' END
        || ' sync ' || quote_literal(current_setting('synchronous_standby_names'))";
    if clients.get(&node).is_none_or(tokio_postgres::Client::is_closed) {
        match tokio::time::timeout(Duration::from_secs(1), tokio_postgres::connect(url, tokio_postgres::NoTls)).await {
            Ok(Ok((client, connection))) => {
                tokio::spawn(connection);
                clients.insert(node, client);
            }
            Ok(Err(_)) | Err(_) => return "does not answer".to_owned(),
        }
    }
    let Some(client) = clients.get(&node) else { return "does not answer".to_owned() };
    match tokio::time::timeout(Duration::from_millis(700), client.query_one(SQL, &[])).await {
        Ok(Ok(row)) => row.get(0),
        Ok(Err(_)) | Err(_) => {
            clients.remove(&node);
            "does not answer".to_owned()
        }
    }
}

/// What became of a primary cut off from everyone while it ran.
pub(crate) enum CutPrimary {
    /// Its keeper stopped it this many seconds before the standby took writes (negative: after).
    Stopped(i64),
    /// Its keeper's first look after the cut found no standby (what it logged), so it never
    /// counted itself cut off and the primary ran on until the network healed.
    StayedUp(String),
}

/// Whether this machine can run an HA cluster (root: a network namespace per server); in CI it
/// must.
fn ha_runs(name: &str) -> bool {
    let root = crate::chaos::running_as_root();
    if !root {
        assert!(
            std::env::var_os("CI").is_none(),
            "ha::{name} needs root (a network namespace per server), and CI must run it"
        );
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "ha::{name} SKIPPED: it needs root (a network namespace per server)");
    }
    root
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("a connection");
    tokio::spawn(connection);
    client
}

/// A planned switchover fences the primary before it asks the monitor: pg_auto_failover 2.0's
/// monitor can send a draining primary to `wait_primary` while its standby is promoted, and a
/// primary that still took writes then would acknowledge them alone and lose them at its rewind
/// (scripts/ha.sh, `ha_switchover`; the HA fault harness lost 6% of a run's writes so). Once
/// fenced, the primary refuses a write on a connection opened before, its standby has every
/// write, and after the switchover the writes are on the new primary, which takes more, and the
/// old one is no longer fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_fences_the_primary_before_the_monitor_moves() {
    if !ha_runs("a_switchover_fences_the_primary_before_the_monitor_moves") {
        return;
    }
    let cluster = tokio::task::block_in_place(|| HaCluster::start(2));
    let url = cluster.url("postgres");
    let before = connect(&url).await;
    before
        .batch_execute("CREATE TABLE acknowledged (id int PRIMARY KEY); INSERT INTO acknowledged VALUES (1)")
        .await
        .expect("a write");

    let fenced = tokio::task::block_in_place(|| cluster.fence_primary());
    let refused = before
        .execute("INSERT INTO acknowledged VALUES (2)", &[])
        .await
        .expect_err("the fenced primary refuses a write");
    assert_eq!(refused.code(), Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION), "{refused}");
    let primary = connect(&format!("host={} port={} user=postgres dbname=postgres", fenced.0, fenced.1)).await;
    // (A checkpoint or autovacuum may still write a little WAL after the fence.)
    let deadline = Instant::now() + Duration::from_secs(5);
    while !primary
        .query_one("SELECT COALESCE(bool_and(flush_lsn >= pg_current_wal_lsn()), false) FROM pg_stat_replication", &[])
        .await
        .expect("the standby's position")
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < deadline, "the standby has flushed every write of the fenced primary");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::task::block_in_place(|| cluster.unfence(&fenced));
    before.execute("INSERT INTO acknowledged VALUES (2)", &[]).await.expect("unfenced, the primary takes writes again");

    tokio::task::block_in_place(|| cluster.switchover());
    let after = connect(&url).await;
    let kept: i64 = after.query_one("SELECT count(*) FROM acknowledged", &[]).await.expect("a read").get(0);
    assert_eq!(kept, 2, "every acknowledged write is on the new primary");
    after.execute("INSERT INTO acknowledged VALUES (3)", &[]).await.expect("the new primary takes writes");
    let old = connect(&format!("host={} port={} user=postgres dbname=postgres", fenced.0, fenced.1)).await;
    let setting: String =
        old.query_one("SHOW default_transaction_read_only", &[]).await.expect("the old primary's setting").get(0);
    let standby: bool = old.query_one("SELECT pg_is_in_recovery()", &[]).await.expect("its role").get(0);
    assert!(standby, "the old primary is the standby now");
    assert_eq!(setting, "off", "the fence is lifted once the old primary is a standby");
}
