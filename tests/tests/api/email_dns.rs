//! Domain verification against real DNS packets: a loopback nameserver
//! (`tests/email/dns_server.py`, dnslib) serves the records, and the projector's
//! `domain_checks` worker asks it, and only it, through hickory-resolver. Without a nameserver
//! configured the records stay `pending` (see `email::domains_senders_topics_and_templates_are_
//! listed_and_read`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::dns_server::DnsServer;
use crate::email::{MAIL_KEY, mail_app_with, test_email};
use crate::helpers::*;
use crate::smtp_sink::SmtpSink;

const WAIT: Duration = Duration::from_secs(20);

/// Reads `GET /domains/{id}` until `done` holds; panics with the last document after [`WAIT`].
async fn domain_until(app: &TestApp, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let response = app.get(&format!("/domains/{id}"), MAIL_KEY).await;
        assert_eq!(response.status, 200, "{:?}", response.body);
        let domain = response.body["data"].clone();
        if done(&domain) {
            return domain;
        }
        assert!(Instant::now() < deadline, "{what} within {WAIT:?}: {domain:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The DNS record of `domain` for `purpose` (`spf`, `dkim`, `dmarc`, `returnPath`).
fn record<'a>(domain: &'a Value, purpose: &str) -> &'a Value {
    domain["records"]
        .as_array()
        .expect("records")
        .iter()
        .find(|record| record["purpose"] == purpose)
        .unwrap_or_else(|| panic!("no {purpose} record in {domain:#}"))
}

/// The record of `domain` for `purpose` as the DNS server publishes it, with `value`.
fn published(domain: &Value, purpose: &str, value: &str) -> Value {
    let record = record(domain, purpose);
    json!({"name": record["name"], "type": record["type"], "value": value})
}

/// `checkedAt` is RFC 3339 UTC with milliseconds, like every timestamp of the API.
fn assert_checked_at(record: &Value) {
    let checked_at = record["checkedAt"].as_str().unwrap_or_else(|| panic!("no checkedAt in {record:#}"));
    let parsed = chrono::DateTime::parse_from_rfc3339(checked_at).expect("checkedAt is RFC 3339");
    assert_eq!(parsed.to_utc().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(), checked_at);
}

#[tokio::test]
async fn domain_records_are_verified_against_the_configured_nameserver() {
    let sink = SmtpSink::start().await;
    let dns = DnsServer::start().await;
    let email = platform::settings::EmailSettings {
        dns_nameserver: Some(format!("127.0.0.1:{}", dns.port())),
        dns_check_interval_seconds: 1,
        ..test_email(&sink)
    };
    let app = mail_app_with(&sink, 100, email).await;
    let domain = app.get("/domains", MAIL_KEY).await.body["data"][0].clone();
    let id = domain["id"].as_str().expect("id").to_owned();
    let purposes = ["spf", "dkim", "dmarc", "returnPath"];

    // Nothing published: every name is NXDOMAIN, which is an answer (nothing there), not an error.
    let unpublished = domain_until(&app, &id, "every record checked and failed", |domain| {
        purposes.iter().all(|purpose| record(domain, purpose)["status"] == "failed")
    })
    .await;
    assert_eq!(unpublished["status"], "failed");
    for purpose in purposes {
        assert_eq!(record(&unpublished, purpose)["found"], json!([]), "{purpose}: {unpublished:#}");
        assert_checked_at(record(&unpublished, purpose));
    }

    // SPF, DKIM and DMARC as asked; the return path points elsewhere. The DKIM key is longer
    // than one TXT character-string (its strings are joined), and its UDP answer comes back
    // truncated, so it is read over TCP.
    let value = |purpose: &str| record(&domain, purpose)["value"].as_str().expect("value").to_owned();
    assert!(value("dkim").len() > 255, "a 2048-bit key: {}", value("dkim"));
    let mut dkim = published(&domain, "dkim", &value("dkim"));
    dkim["truncate"] = json!(true);
    let correct = [published(&domain, "spf", &value("spf")), dkim, published(&domain, "dmarc", &value("dmarc"))];
    let mut records = correct.to_vec();
    records.push(published(&domain, "returnPath", "elsewhere.example.net"));
    dns.set_records(&records).await;
    let checked = domain_until(&app, &id, "spf, dkim and dmarc verified and the wrong return path found", |domain| {
        ["spf", "dkim", "dmarc"].iter().all(|purpose| record(domain, purpose)["status"] == "verified")
            && record(domain, "returnPath")["found"] != json!([])
    })
    .await;
    for purpose in ["spf", "dkim", "dmarc"] {
        assert_eq!(record(&checked, purpose)["found"], json!([value(purpose)]), "{purpose}: {checked:#}");
        assert_checked_at(record(&checked, purpose));
    }
    let return_path = record(&checked, "returnPath");
    assert_eq!(return_path["status"], "failed", "{checked:#}");
    assert_eq!(return_path["found"], json!(["elsewhere.example.net"]));
    assert_eq!(checked["status"], "failed");
    let queries = dns.queries().await;
    let dkim_name = record(&domain, "dkim")["name"].as_str().expect("name").to_ascii_lowercase();
    let asked = |name: &str, kind: &str, protocol: &str| {
        queries.iter().any(|query| query["name"] == name && query["type"] == kind && query["protocol"] == protocol)
    };
    assert!(asked(&dkim_name, "TXT", "udp") && asked(&dkim_name, "TXT", "tcp"), "{queries:#?}");
    let return_path_name = record(&domain, "returnPath")["name"].as_str().expect("name").to_ascii_lowercase();
    assert!(asked(&return_path_name, "CNAME", "udp"), "{queries:#?}");

    // The CNAME fixed, in another case and with the root dot: DNS names compare without either.
    let mut fixed = correct.to_vec();
    fixed.push(published(&domain, "returnPath", &format!("{}.", value("returnPath").to_ascii_uppercase())));
    dns.set_records(&fixed).await;
    let verified = domain_until(&app, &id, "the domain verified", |domain| domain["status"] == "verified").await;
    for purpose in purposes {
        let record = record(&verified, purpose);
        assert_eq!(record["status"], "verified", "{purpose}: {verified:#}");
        assert_eq!(record["found"], json!([value(purpose)]), "{purpose}: {verified:#}");
    }

    // The nameserver fails for the DKIM name (SERVFAIL): a failed lookup is not an empty
    // answer, so the last result stays while the other records are checked again.
    let mut failing = fixed.clone();
    failing[1]["fail"] = json!(true);
    dns.set_records(&failing).await;
    let asked_before = dns.queries().await.len();
    let deadline = Instant::now() + WAIT;
    loop {
        // Two checks asked since (one at a time): the first one's results are committed.
        let queries = dns.queries().await;
        let failed = queries[asked_before..].iter().filter(|query| query["name"] == dkim_name).count();
        if failed >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "two DKIM lookups within {WAIT:?}: {queries:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let response = app.get(&format!("/domains/{id}"), MAIL_KEY).await;
    let kept = &response.body["data"];
    assert_eq!(kept["status"], "verified", "{kept:#}");
    assert_eq!(record(kept, "dkim")["found"], json!([value("dkim")]), "{kept:#}");
    let spf_checked_at = |domain: &Value| record(domain, "spf")["checkedAt"].as_str().expect("checkedAt").to_owned();
    assert!(spf_checked_at(kept) > spf_checked_at(&verified), "the other records were checked again: {kept:#}");
}
