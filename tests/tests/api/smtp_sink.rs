//! A handle on the SMTP sink of the tests (`tests/email/smtp_sink.py`): a loopback SMTP server
//! (aiosmtpd) that records every message it accepts and verifies its DKIM signature with dkimpy,
//! against public keys registered here instead of DNS, so that what we send and sign is not
//! checked by our own Rust code. It answers as told (accept, refuse at the end of DATA, refuse
//! RCPT TO with a 4xx or 5xx, or answer DATA late), for the relay failures of the email tests.
//!
//! It runs under `$TEST_PYTHON`, the interpreter of the venv that `scripts/test` creates
//! (`scripts/pyenv.sh`).

#![allow(dead_code, reason = "each test module uses only some of the sink's accessors")]

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::helpers::{ChildGuard, start_python_helper};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/email/smtp_sink.py");

/// A running sink; the process is killed when this is dropped (and exits by itself when the
/// test process goes away, as its standard input closes).
pub(crate) struct SmtpSink {
    smtp_port: u16,
    /// `http://127.0.0.1:PORT` of the control API.
    control_base: String,
    http: reqwest::Client,
    child: ChildGuard,
}

impl SmtpSink {
    /// Starts the sink on free ports of 127.0.0.1, accepting every message, and waits until it
    /// listens.
    pub(crate) async fn start() -> SmtpSink {
        Self::start_with(&[]).await
    }

    /// Starts the sink speaking TLS with the certificate `cert` and key `key` (PEM files):
    /// `starttls` (offered, and required before MAIL) or `implicit` (SMTPS).
    pub(crate) async fn start_tls(mode: &str, cert: &std::path::Path, key: &std::path::Path) -> SmtpSink {
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        Self::start_with(&["--tls", mode, "--tls-cert", &cert, "--tls-key", &key]).await
    }

    async fn start_with(extra: &[&str]) -> SmtpSink {
        let mut args = vec!["--smtp-port", "0"];
        args.extend_from_slice(extra);
        let (child, line) = start_python_helper(SCRIPT, &args, "SMTP sink", "the aiosmtpd and dkimpy packages").await;
        let (smtp_port, control_port) = parse_listening(&line)
            .unwrap_or_else(|| panic!("the SMTP sink did not start: it printed {line:?} (its stderr is above)"));
        SmtpSink {
            smtp_port,
            control_base: format!("http://127.0.0.1:{control_port}"),
            http: reqwest::Client::new(),
            child,
        }
    }

    /// The SMTP port on 127.0.0.1.
    pub(crate) fn smtp_port(&self) -> u16 {
        self.smtp_port
    }

    /// The sink as a relay URL for `APP__EMAIL__RELAY_URL`: plain SMTP, no AUTH. (The sink also
    /// accepts any `user:password@`, and records the login as `authLogin`.)
    pub(crate) fn relay_url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.smtp_port)
    }

    /// The email settings of a spawned process that sends to this sink: the relay, the public
    /// base URL of unsubscribe links, the relay timeout, a 1 s grace before the outbox worker
    /// takes over an email and 100 ms outbox polls.
    pub(crate) fn process_env(&self, timeout_ms: u64) -> Vec<(&'static str, String)> {
        vec![
            ("APP__EMAIL__RELAY_URL", self.relay_url()),
            ("APP__EMAIL__PUBLIC_BASE_URL", "https://api.example.test/v1".to_owned()),
            ("APP__EMAIL__TIMEOUT_MS", timeout_ms.to_string()),
            ("APP__EMAIL__HANDOFF_GRACE_MS", "1000".to_owned()),
            ("APP__EMAIL__OUTBOX_POLL_MS", "100".to_owned()),
        ]
    }

    /// Sets how the sink answers transactions from their next MAIL FROM on: `{"mode": "accept"}`
    /// (the default), `{"mode": "reject", "code": 550, "message": "..."}` (refuses at the end of
    /// DATA), `{"mode": "tempfail", "code": 451, "message": "..."}` (refuses every RCPT TO),
    /// `{"mode": "rejectRcpt", "code": 550, "message": "...", "recipients": [...]}` (refuses RCPT
    /// TO of the listed addresses, or of all without `recipients`), `{"mode": "delayData",
    /// "seconds": N}` (answers DATA after N s, then accepts). Every key but `mode` is optional.
    pub(crate) async fn set_mode(&self, mode: Value) {
        self.put("mode", &mode).await;
    }

    /// Publishes a DKIM key record, e.g. `add_dkim_record("s1._domainkey.example.com",
    /// "v=DKIM1; k=rsa; p=...")`, where the sink's DKIM verification looks it up.
    pub(crate) async fn add_dkim_record(&self, name: &str, txt: &str) {
        self.put("dkim-keys", &json!({ "records": { name: txt } })).await;
    }

    /// Every message accepted, in arrival order: `mailFrom`, `mailOptions`, `rcptTo`,
    /// `rcptOptions`, `helo`, `authLogin`, `raw` (base64; see [`raw_bytes`]), `headers`
    /// (lowercased name to the list of its decoded values), `messageId`, `text` and `html`
    /// (decoded bodies, `"\n"` line ends, null when absent), `dkim` (`present`, `valid`,
    /// `domain`, `selector`, `signedHeaders`, `error`), `receivedAt`, `answered` (250, or null
    /// while a `delayData` answer is pending or when the client gave up on it).
    pub(crate) async fn messages(&self) -> Vec<Value> {
        let mut body = self.get_messages().await;
        serde_json::from_value(body["messages"].take()).expect("a list of messages")
    }

    /// Every transaction the sink refused as told, in arrival order: `stage` (`rcpt` or `data`),
    /// `code`, `reply`, `mailFrom`, `rcptTo` (at `rcpt`, the refused address alone),
    /// `messageId` (at `data`), `receivedAt`.
    pub(crate) async fn rejected(&self) -> Vec<Value> {
        let mut body = self.get_messages().await;
        serde_json::from_value(body["rejected"].take()).expect("a list of refused transactions")
    }

    /// The `Message-ID` headers of the messages accepted (of those that have one), in arrival
    /// order; a message sent twice shows twice.
    pub(crate) async fn message_ids(&self) -> Vec<String> {
        self.messages().await.iter().filter_map(|message| message["messageId"].as_str().map(str::to_owned)).collect()
    }

    /// A summary of what the sink accepted, for runs too large to fetch whole: `accepted`,
    /// `rejected`, `messageIds` and `rcptTo` (in arrival order) and `dkimInvalid`.
    pub(crate) async fn summary(&self) -> Value {
        let response = self
            .http
            .get(format!("{}/_control/summary", self.control_base))
            .send()
            .await
            .expect("GET the SMTP sink's summary");
        assert!(response.status().is_success(), "the SMTP sink's summary: {}", response.status());
        response.json().await.expect("the summary is JSON")
    }

    /// Forgets the messages accepted and the transactions refused (the mode and the DKIM records
    /// stay).
    pub(crate) async fn clear(&self) {
        let response = self
            .http
            .delete(format!("{}/_control/messages", self.control_base))
            .send()
            .await
            .expect("DELETE the SMTP sink's messages");
        let status = response.status();
        assert!(status.is_success(), "clearing the SMTP sink: {status}");
    }

    /// Polls until the sink has accepted at least `count` messages and returns them all; panics
    /// with what it did accept and refuse after `timeout`.
    pub(crate) async fn wait_for(&self, count: usize, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut body = self.get_messages().await;
            let messages: Vec<Value> = serde_json::from_value(body["messages"].take()).expect("a list of messages");
            if messages.len() >= count {
                return messages;
            }
            if Instant::now() >= deadline {
                let summary: Vec<Value> = messages
                    .iter()
                    .map(|message| {
                        json!({
                            "messageId": message["messageId"],
                            "rcptTo": message["rcptTo"],
                            "subject": message["headers"]["subject"],
                            "dkim": message["dkim"],
                        })
                    })
                    .collect();
                panic!(
                    "the SMTP sink accepted {} messages, not {count}, within {timeout:?}: {summary:#?}; refused: {:#?}",
                    messages.len(),
                    body["rejected"]
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn put(&self, path: &str, body: &Value) {
        let response = self
            .http
            .put(format!("{}/_control/{path}", self.control_base))
            .json(body)
            .send()
            .await
            .expect("PUT to the SMTP sink");
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "PUT /_control/{path} {body} on the SMTP sink: {status} {text}");
    }

    async fn get_messages(&self) -> Value {
        let response = self
            .http
            .get(format!("{}/_control/messages", self.control_base))
            .send()
            .await
            .expect("GET from the SMTP sink");
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "GET /_control/messages on the SMTP sink: {status} {body}");
        serde_json::from_str(&body).expect("the SMTP sink answers JSON")
    }
}

/// The bytes of a recorded message as received after DATA (CRLF line ends, dot-unstuffed).
pub(crate) fn raw_bytes(message: &Value) -> Vec<u8> {
    let raw = message["raw"].as_str().expect("a recorded message has raw");
    STANDARD.decode(raw).expect("raw is base64")
}

/// The ports of `LISTENING smtp=<port> http=<port>`.
fn parse_listening(line: &str) -> Option<(u16, u16)> {
    let mut fields = line.trim().strip_prefix("LISTENING ")?.split_whitespace();
    let smtp = fields.next()?.strip_prefix("smtp=")?.parse().ok()?;
    let http = fields.next()?.strip_prefix("http=")?.parse().ok()?;
    Some((smtp, http))
}
