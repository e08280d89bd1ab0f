//! Hands messages to the relay over SMTP (pooled connections, TLS and AUTH as the relay URL
//! says), or writes them as `.eml` files when no relay is configured. An outcome is one of
//! four: the relay accepted the message, refused it (now or for good), could not be reached
//! (nothing was sent), or the exchange broke off where the message may have been accepted.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use lettre::transport::smtp::PoolConfig;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use secrecy::ExposeSecret;

use super::message::Signed;
use crate::settings::EmailSettings;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The relay answered 2xx to the message.
    Accepted { reply: String },
    /// The relay answered 4xx (`permanent: false`) or 5xx; the message was not accepted.
    /// `code` is the reply code when there was one.
    Rejected { permanent: bool, code: Option<u16>, reply: String },
    /// No connection to the relay: nothing was sent.
    Unreachable { message: String },
    /// The exchange broke off (timeout, reset) after it started: the relay may have accepted
    /// the message.
    Unknown { message: String },
}

pub struct Mailer {
    inner: Inner,
}

enum Inner {
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    Files(PathBuf),
}

impl Mailer {
    pub fn from_settings(settings: &EmailSettings) -> anyhow::Result<Self> {
        let inner = match &settings.relay_url {
            Some(url) => {
                let mut builder = AsyncSmtpTransport::<Tokio1Executor>::from_url(url.expose_secret())
                    .context("APP__EMAIL__RELAY_URL")?;
                if let Some(tls) = relay_tls(url.expose_secret(), settings.relay_ca_file.as_deref())? {
                    builder = builder.tls(tls);
                }
                let transport = builder
                    .hello_name(ClientId::Domain(settings.hello_name.clone()))
                    .timeout(Some(Duration::from_millis(settings.timeout_ms)))
                    .pool_config(PoolConfig::new().max_size(settings.pool_size))
                    .build();
                Inner::Smtp(transport)
            }
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
            Inner::Smtp(transport) => match transport.send_raw(&message.envelope, &message.bytes).await {
                Ok(response) => {
                    Outcome::Accepted { reply: reply_text(response.code().to_string(), response.message()) }
                }
                Err(error) => classify(&error),
            },
            Inner::Files(dir) => match write_eml(dir, email_id, &message.bytes).await {
                Ok(path) => Outcome::Accepted { reply: format!("written to {}", path.display()) },
                Err(error) => Outcome::Unreachable { message: format!("{error:#}") },
            },
        }
    }
}

/// The relay's TLS when it differs from what lettre makes of the URL: the public roots and
/// the certificates of `ca_file`. Refuses a URL whose TLS could fall back to clear text, and
/// a CA file without TLS.
fn relay_tls(url: &str, ca_file: Option<&str>) -> anyhow::Result<Option<Tls>> {
    let parsed = url::Url::parse(url).context("APP__EMAIL__RELAY_URL")?;
    let tls = parsed.query_pairs().find(|(key, _)| key == "tls").map(|(_, value)| value.into_owned());
    let wrapped = match (parsed.scheme(), tls.as_deref()) {
        ("smtps", _) => Some(true),
        ("smtp", Some("required")) => Some(false),
        ("smtp", Some("opportunistic")) => anyhow::bail!(
            "APP__EMAIL__RELAY_URL: tls=opportunistic would send in clear text to a relay without STARTTLS; \
             use tls=required or smtps://"
        ),
        _ => None,
    };
    let Some(ca_file) = ca_file else { return Ok(None) };
    let Some(wrapped) = wrapped else {
        anyhow::bail!("APP__EMAIL__RELAY_CA_FILE is set but the relay URL has no TLS (smtps:// or ?tls=required)")
    };
    let host = parsed.host_str().context("APP__EMAIL__RELAY_URL: no host")?.to_owned();
    let pem = std::fs::read(ca_file).with_context(|| format!("APP__EMAIL__RELAY_CA_FILE: reading {ca_file}"))?;
    let certificate = Certificate::from_pem(&pem).context("APP__EMAIL__RELAY_CA_FILE: not a PEM certificate")?;
    let parameters = TlsParameters::builder(host)
        .add_root_certificate(certificate)
        .build_rustls()
        .context("APP__EMAIL__RELAY_CA_FILE: the TLS parameters")?;
    Ok(Some(if wrapped { Tls::Wrapper(parameters) } else { Tls::Required(parameters) }))
}

fn reply_text<'a>(code: String, lines: impl Iterator<Item = &'a str>) -> String {
    let lines: Vec<&str> = lines.collect();
    format!("{code} {}", lines.join(" ")).trim().to_owned()
}

fn classify(error: &lettre::transport::smtp::Error) -> Outcome {
    let text = error.to_string();
    if error.is_permanent() || error.is_transient() {
        let code = error.status().and_then(|code| code.to_string().parse().ok());
        Outcome::Rejected { permanent: error.is_permanent(), code, reply: text }
    } else if error.is_timeout() || text.starts_with("network error") || text.starts_with("response error") {
        Outcome::Unknown { message: text }
    } else {
        // Connection, TLS and shutdown errors happen before any message data is sent.
        Outcome::Unreachable { message: text }
    }
}

async fn write_eml(dir: &std::path::Path, email_id: &str, bytes: &[u8]) -> anyhow::Result<PathBuf> {
    tokio::fs::create_dir_all(dir).await.with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{email_id}.eml"));
    let partial = dir.join(format!(".{email_id}.eml.partial"));
    tokio::fs::write(&partial, bytes).await?;
    tokio::fs::rename(&partial, &path).await?;
    Ok(path)
}
