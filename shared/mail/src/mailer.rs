//! Hands messages to the relay over SMTP ([`crate::relay`]: pooled, pipelined sessions, TLS
//! and AUTH as the relay URL says), or writes them as `.eml` files when no relay is
//! configured (each headed by the `Return-Path` that final delivery would add). An outcome is
//! one of four: the relay accepted the message, refused it (now or for good), could not be
//! reached (nothing was sent), or the exchange broke off where the message may have been
//! accepted.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use secrecy::ExposeSecret;

use crate::message::Signed;
pub use crate::relay::Outcome;
use crate::relay::Relay;
use platform::settings::EmailSettings;

pub struct Mailer {
    inner: Inner,
}

enum Inner {
    Smtp(Box<Relay>),
    Files(PathBuf),
}

impl Mailer {
    pub fn from_settings(settings: &EmailSettings) -> anyhow::Result<Self> {
        let inner = match &settings.relay_url {
            Some(url) => Inner::Smtp(Box::new(Relay::new(
                url.expose_secret(),
                settings.relay_ca_file.as_deref(),
                &settings.hello_name,
                Duration::from_millis(settings.timeout_ms),
                settings.pool_size,
            )?)),
            None => Inner::Files(PathBuf::from(&settings.eml_dir)),
        };
        Ok(Self { inner })
    }

    /// Where messages go, for logs: the relay's host or the `.eml` folder.
    pub fn describe(&self) -> String {
        match &self.inner {
            Inner::Smtp(_) => "the SMTP relay".to_owned(),
            Inner::Files(dir) => format!(".eml files in {}", dir.display()),
        }
    }

    pub async fn send(&self, email_id: &str, message: &Signed) -> Outcome {
        match &self.inner {
            Inner::Smtp(relay) => relay.send(&message.envelope, &message.bytes).await,
            Inner::Files(dir) => match write_eml(dir, email_id, &eml(message)).await {
                // The reply is recorded and shown (`GET /emails/{id}`): the file's name, never
                // the server's path to it.
                Ok(path) => Outcome::Accepted {
                    reply: format!(
                        "written as {} in the .eml folder",
                        path.file_name().map(|name| name.to_string_lossy()).unwrap_or_default()
                    ),
                },
                Err(error) => Outcome::Unreachable { message: format!("{error:#}") },
            },
        }
    }
}

/// The message as a mailbox holds it: `Return-Path` with the envelope sender first, as a
/// delivery agent writes it at final delivery (RFC 5321 §4.4), so a reader of the file sees
/// where bounces go. Only files get it: a relay's own final delivery adds it. Outside the
/// DKIM signature, as on any delivered message.
fn eml(message: &Signed) -> Vec<u8> {
    let sender = message.envelope.from().map(ToString::to_string).unwrap_or_default();
    let header = format!("Return-Path: <{sender}>\r\n");
    let mut bytes = Vec::with_capacity(header.len() + message.bytes.len());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&message.bytes);
    bytes
}

async fn write_eml(dir: &std::path::Path, email_id: &str, bytes: &[u8]) -> anyhow::Result<PathBuf> {
    tokio::fs::create_dir_all(dir).await.with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{email_id}.eml"));
    let partial = dir.join(format!(".{email_id}.eml.partial"));
    tokio::fs::write(&partial, bytes).await?;
    tokio::fs::rename(&partial, &path).await?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eml_file_starts_with_the_envelope_sender_as_its_return_path() {
        let sender: lettre::Address = "bounce+em_1@bounces.example.test".parse().expect("an address");
        let to: lettre::Address = "ada@example.test".parse().expect("an address");
        let envelope = lettre::address::Envelope::new(Some(sender), vec![to]).expect("an envelope");
        let message = Signed { envelope, bytes: b"DKIM-Signature: x\r\nSubject: hi\r\n\r\nHello.\r\n".to_vec() };
        assert_eq!(
            String::from_utf8(eml(&message)).expect("text"),
            "Return-Path: <bounce+em_1@bounces.example.test>\r\nDKIM-Signature: x\r\nSubject: hi\r\n\r\nHello.\r\n"
        );
    }
}
