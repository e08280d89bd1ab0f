//! A handle on the webhook receiver of the tests (`tests/webhooks/receiver.py`): a loopback
//! HTTP server that records every delivery and verifies its signature with the reference Python
//! implementation of Standard Webhooks (the `standardwebhooks` package), so that what we sign is
//! not checked by our own Rust code. Its endpoints answer as told (a status, `Retry-After`, a
//! delay, failing the first attempts of each webhook-id, dropping the connection).
//!
//! It runs under `$TEST_PYTHON`, the interpreter of the venv that `scripts/test` creates
//! (`scripts/pyenv.sh`).

#![allow(dead_code, reason = "each test module uses only some of the receiver's accessors")]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{KeyInit, Mac};
use serde_json::{Value, json};

use crate::helpers::{ChildGuard, start_python_helper};

type Hmac = hmac::Hmac<sha2::Sha256>;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/webhooks/receiver.py");

/// A running receiver; the process is killed when this is dropped (and exits by itself when
/// the test process goes away, as its standard input closes).
pub(crate) struct Receiver {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    http: reqwest::Client,
    child: ChildGuard,
}

impl Receiver {
    /// Starts the receiver on a free port of 127.0.0.1 and waits until it listens.
    pub(crate) async fn start() -> Receiver {
        let (child, line) =
            start_python_helper(SCRIPT, &["--port", "0"], "receiver", "the standardwebhooks package").await;
        let port: u16 = line
            .trim()
            .strip_prefix("LISTENING ")
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("the receiver did not start: it printed {line:?} (its stderr is above)"));
        Receiver { base: format!("http://127.0.0.1:{port}"), http: reqwest::Client::new(), child }
    }

    /// Registers endpoint `name` (URL-safe) with these `whsec_` secrets and behaviour, or replaces
    /// the secrets and behaviour of an existing one (keeping what it received). Behaviour:
    /// `{}` answers 204; keys `status`, `retryAfter`, `delaySeconds`, `failFirst`,
    /// `closeConnection` (see the receiver's documentation).
    pub(crate) async fn endpoint(&self, name: &str, secrets: &[&str], behaviour: Value) {
        let response = self
            .http
            .put(format!("{}/_control/endpoints/{name}", self.base))
            .json(&json!({ "secrets": secrets, "behaviour": behaviour }))
            .send()
            .await
            .expect("PUT an endpoint to the receiver");
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "registering endpoint {name} on the receiver: {status} {body}");
    }

    /// The port the receiver listens on.
    pub(crate) fn port(&self) -> u16 {
        self.base.rsplit(':').next().and_then(|port| port.parse().ok()).expect("the receiver's port")
    }

    /// The URL that deliveries to endpoint `name` are POSTed to.
    pub(crate) fn url(&self, name: &str) -> String {
        format!("{}/hooks/{name}", self.base)
    }

    async fn control(&self, path: &str) -> Value {
        let response =
            self.http.get(format!("{}/_control/{path}", self.base)).send().await.expect("GET from the receiver");
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "GET /_control/{path} on the receiver: {status} {body}");
        serde_json::from_str(&body).expect("the receiver answers JSON")
    }

    /// Every request endpoint `name` received, in arrival order: `webhookId`, `xWebhookId`,
    /// `timestamp`, `signatures`, `verifiedWith` (indices of the endpoint's secrets that verify
    /// it), `body` (parsed JSON or null), `rawBody`, `headers`, `receivedAt`, `answered`
    /// (the status sent, null when the connection was dropped).
    pub(crate) async fn received(&self, name: &str) -> Vec<Value> {
        let mut body = self.control(&format!("endpoints/{name}/received")).await;
        serde_json::from_value(body["received"].take()).expect("a list of received requests")
    }

    /// How many requests endpoint `name` received per `webhook-id`.
    pub(crate) async fn ids(&self, name: &str) -> HashMap<String, u64> {
        let mut body = self.control(&format!("endpoints/{name}/ids")).await;
        serde_json::from_value(body["ids"].take()).expect("a map of webhook-ids to counts")
    }

    /// Polls until endpoint `name` has received at least `count` requests and returns them all;
    /// panics with what it did receive after `timeout`.
    pub(crate) async fn wait_for(&self, name: &str, count: usize, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let received = self.received(name).await;
            if received.len() >= count {
                return received;
            }
            assert!(
                Instant::now() < deadline,
                "endpoint {name} received {} requests, not {count}, within {timeout:?}: {received:#?}",
                received.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// The self-test: requests signed by hand, here, checked by the package.

fn secret(byte: u8) -> String {
    format!("whsec_{}", STANDARD.encode([byte; 32]))
}

/// A Standard Webhooks signature computed here, independently of the platform's signer.
fn sign(secret: &str, id: &str, timestamp: u64, body: &str) -> String {
    let key = STANDARD.decode(secret.strip_prefix("whsec_").expect("a whsec_ secret")).expect("base64");
    let mut mac = <Hmac as KeyInit>::new_from_slice(&key).expect("any key length");
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs()
}

async fn deliver(
    http: &reqwest::Client,
    url: &str,
    id: &str,
    timestamp: u64,
    signatures: &[String],
    body: &str,
) -> reqwest::Result<reqwest::Response> {
    http.post(url)
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("x-webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signatures.join(" "))
        .body(body.to_owned())
        .send()
        .await
}

#[tokio::test]
async fn the_receiver_verifies_with_the_standard_webhooks_package() {
    let receiver = Receiver::start().await;
    let http = reqwest::Client::new();
    let (old, new, wrong) = (secret(1), secret(2), secret(3));
    let body = r#"{"type":"record.created","data":{"id":"rec_1"}}"#;
    let now = now();
    receiver.endpoint("rotating", &[&old, &new], json!({})).await;

    // (webhook-id, timestamp, signatures, body sent, indices of the secrets that verify it)
    let cases = [
        ("msg_new", now, vec![sign(&new, "msg_new", now, body)], body, json!([1])),
        ("msg_old", now, vec![sign(&old, "msg_old", now, body)], body, json!([0])),
        (
            "msg_all",
            now,
            vec![
                sign(&wrong, "msg_all", now, body),
                sign(&new, "msg_all", now, body),
                sign(&old, "msg_all", now, body),
            ],
            body,
            json!([0, 1]),
        ),
        ("msg_wrong", now, vec![sign(&wrong, "msg_wrong", now, body)], body, json!([])),
        ("msg_other_id", now, vec![sign(&new, "msg_other", now, body)], body, json!([])),
        ("msg_tampered", now, vec![sign(&new, "msg_tampered", now, body)], r#"{"type":"x"}"#, json!([])),
        // The package refuses timestamps more than five minutes from now.
        ("msg_stale", now - 3600, vec![sign(&new, "msg_stale", now - 3600, body)], body, json!([])),
    ];
    for (id, timestamp, signatures, sent, _) in &cases {
        let response =
            deliver(&http, &receiver.url("rotating"), id, *timestamp, signatures, sent).await.expect("deliver");
        assert_eq!(response.status(), 204, "{id}");
    }
    let unsigned = http.post(receiver.url("rotating")).body(body).send().await.expect("deliver unsigned");
    assert_eq!(unsigned.status(), 204);

    let received = receiver.wait_for("rotating", cases.len() + 1, Duration::from_secs(10)).await;
    assert_eq!(received.len(), cases.len() + 1);
    for ((id, timestamp, signatures, sent, verified), record) in cases.iter().zip(&received) {
        assert_eq!(record["webhookId"], *id);
        assert_eq!(record["xWebhookId"], *id);
        assert_eq!(record["timestamp"], *timestamp);
        assert_eq!(record["signatures"], json!(signatures));
        assert_eq!(record["verifiedWith"], *verified, "{id}");
        assert_eq!(record["body"], serde_json::from_str::<Value>(sent).expect("JSON"));
        assert_eq!(record["answered"], 204);
    }
    let record = &received[cases.len()];
    assert_eq!(record["webhookId"], Value::Null);
    assert_eq!(record["signatures"], json!([]));
    assert_eq!(record["verifiedWith"], json!([]));

    // An unknown endpoint answers 404 and records nothing.
    let unknown = deliver(&http, &receiver.url("nowhere"), "msg_1", now, &[], body).await.expect("deliver");
    assert_eq!(unknown.status(), 404);
    assert_eq!(receiver.received("rotating").await.len(), cases.len() + 1);

    // failFirst fails the first attempts of each webhook-id, then answers the status.
    receiver.endpoint("flaky", &[&new], json!({ "failFirst": 2, "status": 204 })).await;
    let mut statuses = Vec::new();
    for id in ["msg_a", "msg_a", "msg_a", "msg_b"] {
        let signature = sign(&new, id, now, body);
        let response = deliver(&http, &receiver.url("flaky"), id, now, &[signature], body).await.expect("deliver");
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [500, 500, 204, 500]);
    assert_eq!(receiver.ids("flaky").await, HashMap::from([("msg_a".into(), 3), ("msg_b".into(), 1)]));
    let received = receiver.received("flaky").await;
    let answered: Vec<&Value> = received.iter().map(|record| &record["answered"]).collect();
    assert_eq!(answered, [&json!(500), &json!(500), &json!(204), &json!(500)]);
    assert!(received.iter().all(|record| record["verifiedWith"] == json!([0])), "{received:#?}");

    // Retry-After, and a dropped connection (recorded, answered with nothing).
    receiver.endpoint("busy", &[], json!({ "status": 429, "retryAfter": "1" })).await;
    let busy = deliver(&http, &receiver.url("busy"), "msg_1", now, &[], body).await.expect("deliver");
    assert_eq!(busy.status(), 429);
    assert_eq!(busy.headers().get("retry-after").and_then(|value| value.to_str().ok()), Some("1"));
    receiver.endpoint("hangup", &[&new], json!({ "closeConnection": true })).await;
    let signature = sign(&new, "msg_1", now, body);
    let dropped = deliver(&http, &receiver.url("hangup"), "msg_1", now, &[signature], body).await;
    assert!(dropped.is_err(), "{dropped:?}");
    let received = receiver.received("hangup").await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0]["answered"], Value::Null);
    assert_eq!(received[0]["verifiedWith"], json!([0]));
}
