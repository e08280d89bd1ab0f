//! Domain verification against real DNS packets: a loopback DNS server
//! (`tests/email/dns_server.py`, dnslib) serves the records, and the projector's domain-check
//! worker asks it (and only it) through hickory-resolver.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::email::{MAIL_KEY, mail_app_with, test_email};
use crate::helpers::*;
use crate::smtp_sink::SmtpSink;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/email/dns_server.py");

/// A running DNS server; killed when dropped.
struct DnsServer {
    port: u16,
    control: String,
    _child: ChildGuard,
}

impl DnsServer {
    fn start() -> DnsServer {
        let python = std::env::var("TEST_PYTHON").expect("TEST_PYTHON: the venv of scripts/pyenv.sh, with dnslib");
        let mut child = ChildGuard(
            Command::new(&python)
                .args([SCRIPT, "--exit-with-stdin"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("starting the DNS server"),
        );
        let mut line = String::new();
        BufReader::new(child.0.stdout.take().expect("piped")).read_line(&mut line).expect("its LISTENING line");
        let port = |key: &str| -> u16 {
            line.split_whitespace()
                .find_map(|part| part.strip_prefix(key))
                .and_then(|port| port.parse().ok())
                .unwrap_or_else(|| panic!("the DNS server printed {line:?}"))
        };
        DnsServer { port: port("dns="), control: format!("http://127.0.0.1:{}", port("http=")), _child: child }
    }

    async fn set_records(&self, records: Value) {
        let response = reqwest::Client::new()
            .put(format!("{}/_control/records", self.control))
            .json(&json!({"records": records}))
            .send()
            .await
            .expect("the control API");
        assert!(response.status().is_success());
    }
}

async fn domain_until(app: &TestApp, id: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let domain = app.get(&format!("/domains/{id}"), MAIL_KEY).await.body["data"].clone();
        if check(&domain) {
            return domain;
        }
        assert!(Instant::now() < deadline, "the domain never got there: {domain:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn status_of<'a>(domain: &'a Value, purpose: &str) -> &'a Value {
    &domain["records"].as_array().expect("records").iter().find(|r| r["purpose"] == purpose).expect("a record")["status"]
}

#[tokio::test]
async fn domain_records_are_verified_against_the_configured_nameserver() {
    let sink = SmtpSink::start().await;
    let dns = DnsServer::start();
    let email = shared::settings::EmailSettings {
        dns_nameserver: Some(format!("127.0.0.1:{}", dns.port)),
        dns_check_interval_seconds: 1,
        ..test_email(&sink)
    };
    let app = mail_app_with(&sink, 100, email).await;
    let domain = app.get("/domains", MAIL_KEY).await.body["data"][0].clone();
    let id = domain["id"].as_str().expect("id").to_owned();
    let records = domain["records"].as_array().expect("records").clone();
    // Everything published as asked, except the return path, which points elsewhere.
    let published: Vec<Value> = records
        .iter()
        .map(|record| {
            let value = if record["purpose"] == "returnPath" {
                json!("elsewhere.example.net")
            } else {
                record["value"].clone()
            };
            json!({"name": record["name"], "type": record["type"], "value": value})
        })
        .collect();
    dns.set_records(Value::Array(published.clone())).await;
    let checked = domain_until(&app, &id, |d| status_of(d, "returnPath") != "pending").await;
    for purpose in ["spf", "dkim", "dmarc"] {
        assert_eq!(status_of(&checked, purpose), "verified", "{purpose}: {checked:#}");
    }
    let return_path =
        checked["records"].as_array().expect("records").iter().find(|r| r["purpose"] == "returnPath").cloned();
    let return_path = return_path.expect("the return path record");
    assert_eq!(return_path["status"], "failed");
    assert_eq!(return_path["found"], json!(["elsewhere.example.net"]));
    assert!(return_path["checkedAt"].is_string());
    assert_eq!(checked["status"], "failed");
    // The DKIM key is longer than one TXT string: the strings are joined.
    assert!(records[1]["value"].as_str().is_some_and(|v| v.len() > 255));

    let fixed: Vec<Value> = records
        .iter()
        .map(|record| json!({"name": record["name"], "type": record["type"], "value": record["value"]}))
        .collect();
    dns.set_records(Value::Array(fixed)).await;
    let verified = domain_until(&app, &id, |d| d["status"] == "verified").await;
    assert!(verified["records"].as_array().expect("records").iter().all(|r| r["status"] == "verified"));
}
