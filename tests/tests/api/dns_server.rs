//! A handle on the DNS server of the tests (`tests/email/dns_server.py`): a loopback nameserver
//! (dnslib) that answers TXT and CNAME questions from the records set here, and NXDOMAIN for
//! any other name, so that domain verification is checked against real DNS packets, over UDP
//! and TCP, with no outside DNS.
//!
//! It runs under `$TEST_PYTHON`, the interpreter of the venv that `scripts/test` creates
//! (`scripts/pyenv.sh`).

use serde_json::{Value, json};

use crate::helpers::{ChildGuard, start_python_helper};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/email/dns_server.py");

/// A running DNS server; the process is killed when this is dropped (and exits by itself when
/// the test process goes away, as its standard input closes).
pub(crate) struct DnsServer {
    port: u16,
    /// `http://127.0.0.1:PORT` of the control API.
    control_base: String,
    http: reqwest::Client,
    _child: ChildGuard,
}

impl DnsServer {
    /// Starts the server on a port of 127.0.0.1 free for UDP and TCP, with no records, and
    /// waits until it listens.
    pub(crate) async fn start() -> DnsServer {
        let (child, line) = start_python_helper(SCRIPT, &["--port", "0"], "DNS server", "the dnslib package").await;
        let (port, control_port) = parse_listening(&line)
            .unwrap_or_else(|| panic!("the DNS server did not start: it printed {line:?} (its stderr is above)"));
        DnsServer {
            port,
            control_base: format!("http://127.0.0.1:{control_port}"),
            http: reqwest::Client::new(),
            _child: child,
        }
    }

    /// The DNS port on 127.0.0.1 (UDP and TCP).
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Replaces every record: each `{"name", "type": "TXT" | "CNAME", "value"}`, plus
    /// `"truncate": true` to answer questions for it over UDP truncated, so that the client
    /// must ask again over TCP, or `"fail": true` to answer questions for its name SERVFAIL.
    pub(crate) async fn set_records(&self, records: &[Value]) {
        let body = json!({ "records": records });
        let response = self
            .http
            .put(format!("{}/_control/records", self.control_base))
            .json(&body)
            .send()
            .await
            .expect("PUT to the DNS server");
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "PUT /_control/records {body} on the DNS server: {status} {text}");
    }

    /// Every question asked so far, in arrival order: `{"name", "type", "protocol": "udp" |
    /// "tcp"}`, the name lowercased and without its trailing dot.
    pub(crate) async fn queries(&self) -> Vec<Value> {
        let response = self
            .http
            .get(format!("{}/_control/queries", self.control_base))
            .send()
            .await
            .expect("GET from the DNS server");
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "GET /_control/queries on the DNS server: {status} {text}");
        let mut body: Value = serde_json::from_str(&text).expect("the DNS server answers JSON");
        serde_json::from_value(body["queries"].take()).expect("a list of queries")
    }
}

/// The ports of `LISTENING dns=<port> http=<port>`.
fn parse_listening(line: &str) -> Option<(u16, u16)> {
    let mut fields = line.trim().strip_prefix("LISTENING ")?.split_whitespace();
    let dns = fields.next()?.strip_prefix("dns=")?.parse().ok()?;
    let http = fields.next()?.strip_prefix("http=")?.parse().ok()?;
    Some((dns, http))
}
