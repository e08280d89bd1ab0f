//! TLS to the relay: STARTTLS and implicit TLS (SMTPS) against the loopback sink speaking TLS
//! with a self-signed certificate made by `openssl` for the test, trusted through
//! `APP__EMAIL__RELAY_CA_FILE`. A relay whose certificate does not verify, or that offers no
//! STARTTLS when the URL requires it, fails the send (`relay_unavailable`); nothing is ever
//! sent in clear text instead.

use std::path::PathBuf;

use crate::email::{mail_app_with, receipt_body, send, template_id, test_email};
use crate::helpers::scratch_dir;
use crate::smtp_sink::SmtpSink;

/// A self-signed certificate for 127.0.0.1 and its key, in a fresh folder: `(cert, key)`.
fn self_signed(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch_dir(&format!("tls-{name}"));
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", &format!("/CN={name}"), "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        // An end-entity certificate (not a CA), which webpki accepts as its own anchor.
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs (scripts/test installs it)");
    assert!(made.status.success(), "openssl req: {}", String::from_utf8_lossy(&made.stderr));
    (cert, key)
}

fn email_settings(sink: &SmtpSink, url: String, ca_file: Option<&PathBuf>) -> platform::settings::EmailSettings {
    let mut email = test_email(sink);
    email.relay_url = Some(url.into());
    email.relay_ca_file = ca_file.map(|path| path.display().to_string());
    email
}

#[tokio::test]
async fn starttls_and_implicit_tls_reach_a_relay_whose_certificate_is_trusted() {
    let (cert, key) = self_signed("relay");
    for (mode, url) in [("starttls", "smtp://127.0.0.1:{port}?tls=required"), ("implicit", "smtps://127.0.0.1:{port}")]
    {
        let sink = SmtpSink::start_tls(mode, &cert, &key).await;
        let url = url.replace("{port}", &sink.smtp_port().to_string());
        let app = mail_app_with(&sink, 100, email_settings(&sink, url, Some(&cert))).await;
        let receipt = template_id(&app, "receipt").await;
        let sent = send(&app, &receipt, &receipt_body("tls@example.com", "Tia"), None).await;
        assert_eq!(sent.body["data"]["status"], "sent", "{mode}: {:?}", sent.body);
        let messages = sink.wait_for(1, std::time::Duration::from_secs(20)).await;
        assert_eq!(messages[0]["tls"], true, "{mode}: the session was encrypted");
        assert_eq!(messages[0]["pipelined"], true, "{mode}: the envelope pipelined inside TLS");
        assert_eq!(messages[0]["dkim"]["valid"], true, "{mode}: {:?}", messages[0]["dkim"]);
    }
}

#[tokio::test]
async fn a_relay_that_cannot_prove_itself_fails_the_send_and_nothing_goes_in_clear_text() {
    let (cert, key) = self_signed("relay");
    let (other, _) = self_signed("someone-else");
    // A certificate the mailer does not trust: the public roots and another certificate.
    let trusts = [(None, "the public roots"), (Some(&other), "another certificate")];
    let modes = [("starttls", "smtp://127.0.0.1:{port}?tls=required"), ("implicit", "smtps://127.0.0.1:{port}")];
    for ((ca_file, trust), (mode, url)) in trusts.into_iter().flat_map(|trust| modes.map(|mode| (trust, mode))) {
        let what = format!("{mode}, trusting {trust}");
        let sink = SmtpSink::start_tls(mode, &cert, &key).await;
        let url = url.replace("{port}", &sink.smtp_port().to_string());
        let app = mail_app_with(&sink, 100, email_settings(&sink, url, ca_file)).await;
        let receipt = template_id(&app, "receipt").await;
        let failed = send(&app, &receipt, &receipt_body("mitm@example.com", "Mo"), None).await;
        assert_eq!(failed.body["data"]["status"], "failed", "{what}: {:?}", failed.body);
        assert_eq!(failed.body["data"]["error"]["code"], "relay_unavailable", "{what}: {:?}", failed.body);
        assert!(sink.messages().await.is_empty(), "{what}: nothing reached the relay");
    }
    // A relay that offers no STARTTLS when the URL requires it.
    let plain = SmtpSink::start().await;
    let url = format!("smtp://127.0.0.1:{}?tls=required", plain.smtp_port());
    let app = mail_app_with(&plain, 100, email_settings(&plain, url, Some(&cert))).await;
    let receipt = template_id(&app, "receipt").await;
    let failed = send(&app, &receipt, &receipt_body("clear@example.com", "Cy"), None).await;
    assert_eq!(failed.body["data"]["error"]["code"], "relay_unavailable", "{:?}", failed.body);
    assert!(plain.messages().await.is_empty(), "nothing was sent in clear text");
    // Settings that could fall back to clear text are refused at start.
    for (url, ca_file) in [
        (format!("smtp://127.0.0.1:{}?tls=opportunistic", plain.smtp_port()), None),
        (format!("smtp://127.0.0.1:{}", plain.smtp_port()), Some(cert.display().to_string())),
    ] {
        let settings = platform::settings::EmailSettings {
            relay_url: Some(url.clone().into()),
            relay_ca_file: ca_file,
            ..Default::default()
        };
        let refused = mail::mailer::Mailer::from_settings(&settings);
        assert!(refused.is_err(), "{url} is refused");
    }
}
