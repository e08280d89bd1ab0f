//! The return-path listener (`projector inbound`): delivery status notifications and abuse
//! feedback reports delivered to it over real SMTP by Python's `smtplib`
//! (`tests/email/deliver.py`), as a remote mail system returns them, for emails really sent
//! to the loopback sink. What they report reaches the log, the suppression list, the audit
//! trail and webhooks (checked with `standardwebhooks`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::email::{MAIL_KEY, mail_app, receipt_body, send, template_id};
use crate::helpers::*;
use crate::smtp_sink::SmtpSink;

const DELIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/email/deliver.py");
const WAIT: Duration = Duration::from_secs(20);
const RETURN_PATH: &str = "bounces.mail.example.test";

/// A running listener.
struct Listener {
    port: u16,
    ops_port: u16,
    process: ChildGuard,
}

/// Starts a listener on free ports. A port found free can be taken before the listener binds
/// it (an outgoing connection of a test running beside this one gets an ephemeral port from
/// the same range): the listener then exits, and it is started again on other ports.
async fn start_listener(app: &TestApp, env: &[(&str, String)]) -> Listener {
    for _ in 0..5 {
        let (port, ops_port) = (free_port(), free_port());
        let mut env = env.to_vec();
        env.push(("APP__INBOUND__PORT", port.to_string()));
        env.push(("APP__INBOUND__HOSTNAME", "mx.mail.example.test".to_owned()));
        env.push(("APP__PROJECTOR__PORT", ops_port.to_string()));
        let mut process = spawn_binary("projector", &["inbound"], &app.database_url, &env);
        for attempt in 0.. {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return Listener { port, ops_port, process };
            }
            if process.0.try_wait().ok().flatten().is_some() {
                break;
            }
            assert!(attempt < 400, "the inbound listener did not start within 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    panic!("the inbound listener exited at start five times");
}

/// Delivers `message` to the listener on `port` for `rcpts` with smtplib; what it answered.
async fn deliver(port: u16, rcpts: &[&str], message: impl Into<Vec<u8>>) -> Value {
    let python = std::env::var("TEST_PYTHON").expect("TEST_PYTHON (scripts/test sets it)");
    let mut args = vec![DELIVER.to_owned(), "--port".to_owned(), port.to_string()];
    for rcpt in rcpts {
        args.extend(["--rcpt".to_owned(), (*rcpt).to_owned()]);
    }
    let message = message.into();
    let output = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = std::process::Command::new(python)
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("starting deliver.py");
        child.stdin.take().expect("stdin").write_all(&message).expect("writing the message");
        child.wait_with_output().expect("deliver.py ran")
    })
    .await
    .expect("the delivery task");
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("deliver.py printed {:?}: {error}", String::from_utf8_lossy(&output.stdout)))
}

fn data_code(answer: &Value) -> i64 {
    answer["data"][0].as_i64().unwrap_or_else(|| panic!("no answer to DATA: {answer}"))
}

/// A delivery status notification about `email_id` (RFC 3464), as Postfix writes one.
fn dsn(email_id: &str, action: &str, status: &str, arrival: &str) -> String {
    format!(
        "From: MAILER-DAEMON@mx.remote.test (Mail Delivery System)\r\n\
         To: bounce+{email_id}@{RETURN_PATH}\r\n\
         Subject: Undelivered Mail Returned to Sender\r\n\
         Auto-Submitted: auto-replied\r\n\
         MIME-Version: 1.0\r\n\
         Content-Type: multipart/report; report-type=delivery-status;\r\n\tboundary=\"B7A2.1732440000/mx.remote.test\"\r\n\
         \r\n\
         This is a MIME-encapsulated message.\r\n\
         \r\n\
         --B7A2.1732440000/mx.remote.test\r\n\
         Content-Description: Notification\r\n\
         Content-Type: text/plain; charset=us-ascii\r\n\
         \r\n\
         I'm sorry to have to inform you that your message could not\r\n\
         be delivered to one or more recipients.\r\n\
         \r\n\
         --B7A2.1732440000/mx.remote.test\r\n\
         Content-Description: Delivery report\r\n\
         Content-Type: message/delivery-status\r\n\
         \r\n\
         Reporting-MTA: dns; mx.remote.test\r\n\
         X-Postfix-Queue-ID: B7A2\r\n\
         Arrival-Date: {arrival}\r\n\
         \r\n\
         Final-Recipient: rfc822; someone@remote.test\r\n\
         Original-Recipient: rfc822;someone@remote.test\r\n\
         Action: {action}\r\n\
         Status: {status}\r\n\
         Remote-MTA: dns; inbox.remote.test\r\n\
         Diagnostic-Code: smtp; {status_code} {status} <someone@remote.test>:\r\n    Recipient address rejected\r\n\
         \r\n\
         --B7A2.1732440000/mx.remote.test\r\n\
         Content-Description: Undelivered Message Headers\r\n\
         Content-Type: text/rfc822-headers\r\n\
         \r\n\
         From: Example Team <hello@mail.example.test>\r\n\
         Message-ID: <{email_id}@mail.example.test>\r\n\
         Subject: Order\r\n\
         \r\n\
         --B7A2.1732440000/mx.remote.test--\r\n",
        status_code = if status.starts_with('5') { 550 } else { 452 },
    )
}

/// An abuse feedback report (ARF, RFC 5965) quoting the message of `email_id`.
fn arf(email_id: &str) -> String {
    format!(
        "From: <staff@fbl.remote.test>\r\n\
         To: <feedback@{RETURN_PATH}>\r\n\
         Subject: FW: Order\r\n\
         MIME-Version: 1.0\r\n\
         Content-Type: multipart/report; report-type=feedback-report;\r\n boundary=\"part1_13d.2e68ed54_boundary\"\r\n\
         \r\n\
         --part1_13d.2e68ed54_boundary\r\n\
         Content-Type: text/plain; charset=\"US-ASCII\"\r\n\
         Content-Transfer-Encoding: 7bit\r\n\
         \r\n\
         This is an email abuse report for an email message received from IP\r\n\
         192.0.2.1 on Thu, 8 Mar 2005 14:00:00 EDT.\r\n\
         \r\n\
         --part1_13d.2e68ed54_boundary\r\n\
         Content-Type: message/feedback-report\r\n\
         \r\n\
         Feedback-Type: abuse\r\n\
         User-Agent: RemoteFBL/2.1\r\n\
         Version: 1\r\n\
         Original-Mail-From: <bounce+{email_id}@{RETURN_PATH}>\r\n\
         Arrival-Date: Thu, 8 Mar 2005 14:00:00 EDT\r\n\
         Source-IP: 192.0.2.1\r\n\
         \r\n\
         --part1_13d.2e68ed54_boundary\r\n\
         Content-Type: message/rfc822\r\n\
         Content-Disposition: inline\r\n\
         \r\n\
         From: <hello@mail.example.test>\r\n\
         Received: from mailserver.example.net (mailserver.example.net [192.0.2.1])\r\n\
         \tby example.com with ESMTP id M63d4137594e46; Thu, 08 Mar 2005 14:00:00 -0400\r\n\
         To: <someone@remote.test>\r\n\
         Subject: Order\r\n\
         MIME-Version: 1.0\r\n\
         Content-type: text/plain\r\n\
         Message-ID: <{email_id}@mail.example.test>\r\n\
         Date: Thu, 02 Sep 2004 12:31:03 -0500\r\n\
         \r\n\
         Spam Spam Spam\r\n\
         \r\n\
         --part1_13d.2e68ed54_boundary--\r\n"
    )
}

/// Sends the receipt to `address`; its email id and the envelope sender it left with.
async fn sent(app: &TestApp, sink: &SmtpSink, address: &str) -> (String, String) {
    let receipt = template_id(app, "receipt").await;
    let before = sink.messages().await.len();
    let response = send(app, &receipt, &receipt_body(address, "Ada"), None).await;
    assert_eq!(response.body["data"]["status"], "sent", "{:?}", response.body);
    let email_id = response.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let messages = sink.wait_for(before + 1, WAIT).await;
    let message = messages[before..].iter().find(|m| m["rcptTo"][0] == address).expect("the message reached the sink");
    let mail_from = message["mailFrom"].as_str().expect("mailFrom").to_owned();
    assert_eq!(mail_from, format!("bounce+{email_id}@{RETURN_PATH}"), "the return path names the email");
    (email_id, mail_from)
}

async fn suppressions_of(app: &TestApp, address: &str) -> Vec<Value> {
    let page = app.get(&format!("/contacts/suppressions?identifier={address}"), MAIL_KEY).await;
    assert_eq!(page.status, 200, "{:?}", page.body);
    page.body["data"].as_array().cloned().unwrap_or_default()
}

/// Polls until `address` holds `count` suppressions (the read model follows the log).
async fn wait_for_suppressions(app: &TestApp, address: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let found = suppressions_of(app, address).await;
        if found.len() >= count {
            return found;
        }
        assert!(Instant::now() < deadline, "{address} has {found:?}, not {count} suppressions");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn count_events(app: &TestApp, event_type: &str, email_id: &str) -> i64 {
    app.query_i64(&format!(
        "SELECT count(*) FROM events WHERE event_type = '{event_type}' AND stream_id = 'email-{email_id}'"
    ))
    .await
}

async fn create_contact(app: &TestApp, address: &str) -> String {
    let created = app.post("/schemas/people/records", MAIL_KEY, &json!({"email": address, "firstName": "Ada"})).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    created.body["data"]["id"].as_str().expect("id").to_owned()
}

#[tokio::test]
async fn a_bounce_and_a_complaint_suppress_the_address_and_reach_webhooks_and_the_audit_trail() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let receiver = crate::email::email_webhook(&app, &["bounced", "complained"]).await;
    let listener = start_listener(&app, &[]).await;

    // A hard bounce, delivered to the return path the email left with.
    let bob = create_contact(&app, "bob@example.com").await;
    let (bounced_id, return_path) = sent(&app, &sink, "bob@example.com").await;
    let dsn = dsn(&bounced_id, "failed", "5.1.1", "Tue, 24 Nov 2026 10:00:00 +0000");
    let answer = deliver(listener.port, &[&return_path], dsn.clone()).await;
    assert_eq!(data_code(&answer), 250, "{answer}");
    let suppressions = wait_for_suppressions(&app, "bob@example.com", 1).await;
    assert_eq!(suppressions[0]["reason"], "bounce", "{suppressions:?}");
    let receipt = template_id(&app, "receipt").await;
    let refused = send(&app, &receipt, &receipt_body("bob@example.com", "Bob"), None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_suppressed")), "{:?}", refused.body);
    // The same report delivered again is recorded once.
    let again = deliver(listener.port, &[&return_path], dsn).await;
    assert_eq!(data_code(&again), 250, "{again}");
    assert_eq!(count_events(&app, "EmailBounced.v1", &bounced_id).await, 1);

    // A complaint, sent to another address of the return path: the quoted Message-ID names
    // the email.
    create_contact(&app, "carol@example.com").await;
    let (complained_id, _) = sent(&app, &sink, "carol@example.com").await;
    let answer = deliver(listener.port, &[&format!("feedback@{RETURN_PATH}")], arf(&complained_id)).await;
    assert_eq!(data_code(&answer), 250, "{answer}");
    let suppressions = wait_for_suppressions(&app, "carol@example.com", 1).await;
    assert_eq!(suppressions[0]["reason"], "complaint", "{suppressions:?}");
    let remove = app
        .send(app.request(
            reqwest::Method::DELETE,
            &format!("/contacts/suppressions/{}", suppressions[0]["id"].as_str().expect("id")),
            Some(MAIL_KEY),
        ))
        .await;
    assert_eq!(remove.status, 409, "a complaint suppression is not removable: {:?}", remove.body);

    // Both reach the webhook, signed (verified by standardwebhooks).
    let received = receiver.wait_for("mail", 2, WAIT).await;
    assert!(received.iter().all(|delivery| delivery["verifiedWith"] == json!([0])), "signed: {received:?}");
    let bounced = received.iter().find(|d| d["body"]["type"] == "email.bounced").expect("email.bounced");
    assert_eq!(bounced["body"]["data"]["emailId"], bounced_id);
    assert_eq!(bounced["body"]["data"]["bounceKind"], "hard");
    assert_eq!(bounced["body"]["data"]["source"], "dsn");
    assert_eq!(bounced["body"]["data"]["status"], "5.1.1");
    assert_eq!(bounced["body"]["data"]["contactId"], bob);
    let complained = received.iter().find(|d| d["body"]["type"] == "email.complained").expect("email.complained");
    assert_eq!(complained["body"]["data"]["emailId"], complained_id);
    assert_eq!(complained["body"]["data"]["feedbackType"], "abuse");
    assert_eq!(complained["body"]["data"]["reporter"], "RemoteFBL/2.1");

    // And the contact's audit trail.
    let trail = app.get(&format!("/schemas/people/records/{bob}/audit-trail"), MAIL_KEY).await;
    assert_eq!(trail.status, 200, "{:?}", trail.body);
    let entries = trail.body["data"].as_array().expect("entries");
    assert_conforms("AuditTrailEntry", entries);
    let entry = entries.iter().find(|entry| entry["type"] == "email_bounced").expect("an email_bounced entry");
    assert_eq!(
        (&entry["emailId"], &entry["bounceKind"], &entry["source"]),
        (&json!(bounced_id), &json!("hard"), &json!("dsn"))
    );
    assert!(entries.iter().any(|entry| entry["type"] == "suppression_added"), "{entries:?}");
}

#[tokio::test]
async fn soft_bounces_of_different_emails_within_the_window_suppress_at_the_limit() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let listener = start_listener(&app, &[("APP__INBOUND__SOFT_BOUNCE_LIMIT", "2".to_owned())]).await;
    let (first, first_path) = sent(&app, &sink, "dave@example.com").await;
    let answer = deliver(listener.port, &[&first_path], dsn(&first, "delayed", "4.4.1", "Mon, 23 Nov 2026")).await;
    assert_eq!(data_code(&answer), 250, "{answer}");
    // Another report about the same email counts once.
    let answer = deliver(listener.port, &[&first_path], dsn(&first, "failed", "4.2.2", "Tue, 24 Nov 2026")).await;
    assert_eq!(data_code(&answer), 250, "{answer}");
    assert_eq!(count_events(&app, "EmailBounced.v1", &first).await, 2);
    app.wait_for_projections().await;
    assert!(suppressions_of(&app, "dave@example.com").await.is_empty(), "one email's soft bounces are not a run");
    let (second, second_path) = sent(&app, &sink, "dave@example.com").await;
    let answer = deliver(listener.port, &[&second_path], dsn(&second, "failed", "4.2.2", "Wed, 25 Nov 2026")).await;
    assert_eq!(data_code(&answer), 250, "{answer}");
    let suppressions = wait_for_suppressions(&app, "dave@example.com", 1).await;
    assert_eq!(suppressions[0]["reason"], "bounce");
    let kinds = app
        .query_i64(&format!(
            "SELECT count(*) FROM events WHERE event_type = 'EmailBounced.v1' AND stream_id IN ('email-{first}', 'email-{second}')"
        ))
        .await;
    assert_eq!(kinds, 3);
}

#[tokio::test]
async fn the_listener_relays_nothing_bounds_messages_and_drops_what_is_not_a_report() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let listener = start_listener(&app, &[("APP__INBOUND__MAX_MESSAGE_BYTES", "20000".to_owned())]).await;
    let (email_id, return_path) = sent(&app, &sink, "erin@example.com").await;
    const RECORDED: &str = "SELECT count(*) FROM events
        WHERE event_type IN ('EmailBounced.v1', 'EmailComplained.v1', 'SuppressionAdded.v1')";
    let before = app.query_i64(RECORDED).await;

    // Other domains are refused: no open relay.
    let relayed = deliver(listener.port, &["victim@elsewhere.test"], "Subject: hi\r\n\r\nhi\r\n").await;
    assert_eq!(relayed["rcpt"][0][1], 550, "{relayed}");
    assert!(relayed["data"].is_null(), "{relayed}");
    // Not a report, a report about an unknown email, a report quoting nothing: accepted and dropped.
    let plain = deliver(listener.port, &[&return_path], "Subject: Out of office\r\n\r\nAway until Monday.\r\n").await;
    assert_eq!(data_code(&plain), 250, "{plain}");
    let unknown_id = "em_0000000000000000000000000000dead";
    let unknown = deliver(
        listener.port,
        &[&format!("bounce+{unknown_id}@{RETURN_PATH}")],
        dsn(unknown_id, "failed", "5.1.1", "Tue, 24 Nov 2026"),
    )
    .await;
    assert_eq!(data_code(&unknown), 250, "{unknown}");
    // Malformed MIME of every shape: cut reports, binary noise, broken boundaries.
    let report = dsn(&email_id, "failed", "5.1.1", "Tue, 24 Nov 2026");
    let mut noise = 0x2545_f491_u32;
    let mut next = move || {
        noise ^= noise << 13;
        noise ^= noise >> 17;
        noise ^= noise << 5;
        noise
    };
    for round in 0..12 {
        let mut bytes: Vec<u8> = match round % 3 {
            0 => report.as_bytes()[..(next() as usize % report.len())].to_vec(),
            1 => (0..(next() % 4000)).map(|_| (next() % 256) as u8).collect(),
            _ => report.replace("boundary=", "boundary").replace("Content-Type", "Content-Tipe").into_bytes(),
        };
        bytes.extend_from_slice(b"\r\n");
        let answer = deliver(listener.port, &[&format!("postmaster@{RETURN_PATH}")], bytes).await;
        assert_eq!(data_code(&answer), 250, "round {round}: {answer}");
    }
    assert_eq!(app.query_i64(RECORDED).await, before, "nothing was recorded");
    // Too big: refused, and the listener still serves.
    let big = format!("Subject: big\r\n\r\n{}\r\n", "x".repeat(100).repeat(300));
    let answer = deliver(listener.port, &[&return_path], big).await;
    assert_eq!(data_code(&answer), 552, "{answer}");
    let answer = deliver(listener.port, &[&return_path], report).await;
    assert_eq!(data_code(&answer), 250, "{answer}");
    assert_eq!(count_events(&app, "EmailBounced.v1", &email_id).await, 1);
    // What was dropped is counted.
    let metrics = reqwest::get(format!("http://127.0.0.1:{}/metrics", listener.ops_port))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    for outcome in ["not_a_report", "unknown_email", "hard_bounce"] {
        assert!(
            metrics
                .lines()
                .any(|line| line.starts_with("inbound_messages_total")
                    && line.contains(&format!("outcome=\"{outcome}\""))),
            "{outcome} is counted: {metrics}"
        );
    }
}

#[tokio::test]
async fn a_report_is_acknowledged_only_once_recorded_and_a_crash_before_the_answer_records_it_once() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let (email_id, return_path) = sent(&app, &sink, "fay@example.com").await;
    // A listener that pauses between the append and its 250, killed in that pause.
    let mut doomed = start_listener(&app, &[("APP__INBOUND__PAUSE_BEFORE_REPLY_MS", "60000".to_owned())]).await;
    let report = dsn(&email_id, "failed", "5.1.1", "Tue, 24 Nov 2026");
    let port = doomed.port;
    let delivery = tokio::spawn({
        let (return_path, report) = (return_path.clone(), report.clone());
        async move { deliver(port, &[&return_path], report).await }
    });
    let deadline = Instant::now() + WAIT;
    while count_events(&app, "EmailBounced.v1", &email_id).await == 0 {
        assert!(Instant::now() < deadline, "the report was not recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!delivery.is_finished(), "recorded before the answer");
    doomed.process.0.kill().expect("kill -9");
    let _ = doomed.process.0.wait();
    let cut = delivery.await.expect("the delivery task");
    assert!(cut["data"].is_null() && !cut["error"].is_null(), "the sender got no answer: {cut}");
    // The sender tries again, as a mail system does when it gets no answer.
    let listener = start_listener(&app, &[]).await;
    let answer = deliver(listener.port, &[&return_path], report).await;
    assert_eq!(data_code(&answer), 250, "{answer}");
    assert_eq!(count_events(&app, "EmailBounced.v1", &email_id).await, 1, "recorded once");
    let suppressions = wait_for_suppressions(&app, "fay@example.com", 1).await;
    assert_eq!(suppressions.len(), 1);
}
