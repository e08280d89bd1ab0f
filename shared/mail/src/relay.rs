//! The SMTP client of the relay: a bounded pool of long-lived sessions, reused without a
//! NOOP check, with MAIL, RCPT and DATA pipelined (RFC 2920) where the relay offers it, so a
//! message on a warm session costs two round trips (envelope, then content) instead of
//! lettre's pooled five (NOOP, MAIL, RCPT, DATA, content).
//!
//! Built on lettre's connection, which does STARTTLS, EHLO, AUTH, reply parsing and
//! dot-stuffing; this module adds the session pool, the pipelining, the time limits, and the
//! socket every session runs on (TCP_NODELAY, and an implicit TLS session's handshake).
//! Every phase is bounded, so one hand-off stays well inside the lease that holds its email
//! (`Settings::email_lease`): connecting with TLS and AUTH three `TIMEOUT_MS`, the envelope
//! one, the content and its reply three (eight in all when a stale pooled session is
//! replaced).
//!
//! What a failure means depends on where it happens. Before the content is sent the relay
//! cannot have accepted the message: a broken or silent session is "unreachable" (nothing
//! sent), and a session that went stale while pooled is replaced once. After the content
//! started, a broken exchange is "unknown".

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::Context;
use lettre::address::Envelope;
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, AsyncTokioStream, Certificate, TlsParameters};
use lettre::transport::smtp::commands::{Data, Ehlo, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::timeout;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// What the relay made of one message.
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

/// How long a pooled session may sit unused before it is closed rather than reused: below
/// the idle limits relays commonly set (Postfix's `smtpd_timeout` is 300 s).
const IDLE_MAX: Duration = Duration::from_secs(30);

/// Where and how to reach the relay, read from its URL.
#[derive(Debug)]
struct Target {
    host: String,
    port: u16,
    security: Security,
    credentials: Option<Credentials>,
}

/// How a session is secured.
enum Security {
    /// Clear text.
    Plain,
    /// STARTTLS, required: never clear text after the greeting.
    StartTls(TlsParameters),
    /// TLS from the first byte (SMTPS), which this module opens on its own socket: lettre's
    /// would open the socket itself, with Nagle's algorithm on. The roots are lettre's (the
    /// public roots of `webpki-roots`) and the CA file's certificates.
    Wrapped { config: Arc<ClientConfig>, name: ServerName<'static> },
}

impl std::fmt::Debug for Security {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Plain => formatter.write_str("Plain"),
            Self::StartTls(parameters) => write!(formatter, "StartTls({})", parameters.domain()),
            Self::Wrapped { name, .. } => write!(formatter, "Wrapped({name:?})"),
        }
    }
}

/// An implicit TLS session on our socket, as lettre's connection takes a stream.
#[derive(Debug)]
struct WrappedStream(tokio_rustls::client::TlsStream<TcpStream>);

impl AsyncRead for WrappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(context, buf)
    }
}

impl AsyncWrite for WrappedStream {
    fn poll_write(mut self: Pin<&mut Self>, context: &mut TaskContext<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(context, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(context)
    }
}

impl AsyncTokioStream for WrappedStream {
    fn peer_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.0.get_ref().0.peer_addr()
    }
}

pub(crate) struct Relay {
    target: Target,
    hello: ClientId,
    timeout: Duration,
    /// One permit per session: at most `POOL_SIZE` exchanges with the relay at once.
    permits: Semaphore,
    idle: std::sync::Mutex<Vec<Session>>,
}

struct Session {
    connection: AsyncSmtpConnection,
    /// The relay offered PIPELINING in its EHLO reply.
    pipelining: bool,
    idle_since: Instant,
}

/// Why an envelope did not get to the content.
enum EnvelopeError {
    /// The relay answered a command with a refusal.
    Refused(Outcome),
    /// The session broke or fell silent; the message was not sent.
    Broken(String),
}

impl Relay {
    /// `url`: `smtp://host[:port]` (plain), `smtp://…?tls=required` (STARTTLS, never clear
    /// text), `smtps://…` (TLS from the first byte), with `user:password@` for AUTH. `ca_file`:
    /// certificates to trust beside the public roots (a TLS URL only).
    pub(crate) fn new(
        url: &str,
        ca_file: Option<&str>,
        hello: &str,
        timeout: Duration,
        pool_size: u32,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            target: target(url, ca_file)?,
            hello: ClientId::Domain(hello.to_owned()),
            timeout,
            permits: Semaphore::new(usize::try_from(pool_size.max(1)).unwrap_or(1)),
            idle: std::sync::Mutex::new(Vec::new()),
        })
    }

    pub(crate) async fn send(&self, envelope: &Envelope, bytes: &[u8]) -> Outcome {
        let Ok(_permit) = self.permits.acquire().await else {
            return Outcome::Unreachable { message: "the relay's session pool is closed".to_owned() };
        };
        let mut pooled = self.take_idle();
        loop {
            let reused = pooled.is_some();
            let mut session = match pooled.take() {
                Some(session) => session,
                None => match timeout(self.timeout * 3, self.connect()).await {
                    Ok(Ok(session)) => session,
                    Ok(Err(error)) => return Outcome::Unreachable { message: format!("{error:#}") },
                    Err(_) => return Outcome::Unreachable { message: "connecting to the relay timed out".to_owned() },
                },
            };
            let broken = match timeout(self.timeout, session.envelope(envelope, bytes)).await {
                Ok(Ok(())) => None,
                Ok(Err(EnvelopeError::Refused(outcome))) => return outcome,
                Ok(Err(EnvelopeError::Broken(message))) => Some(message),
                Err(_) => Some("the relay did not answer the envelope in time".to_owned()),
            };
            if let Some(message) = broken {
                if reused {
                    // Closed by the relay while pooled: nothing was sent, so a new session
                    // may carry the message.
                    continue;
                }
                return Outcome::Unreachable { message };
            }
            // The relay does its work (queueing, content checks) before this reply, which
            // RFC 5321 gives the longest wait of any (10 minutes): three times the others.
            return match timeout(self.timeout * 3, session.connection.message(bytes)).await {
                Ok(Ok(response)) => {
                    let lines: Vec<&str> = response.message().collect();
                    let reply = format!("{} {}", response.code(), lines.join(" ")).trim().to_owned();
                    self.put_idle(session);
                    Outcome::Accepted { reply }
                }
                Ok(Err(error)) => refused(&error).unwrap_or_else(|| Outcome::Unknown { message: error.to_string() }),
                Err(_) => Outcome::Unknown { message: "the relay did not answer the message in time".to_owned() },
            };
        }
    }

    /// A new session: connected, TLS as the URL asks, capabilities read, AUTH done.
    async fn connect(&self) -> anyhow::Result<Session> {
        let target = &self.target;
        let stream = timeout(self.timeout, TcpStream::connect((target.host.as_str(), target.port)))
            .await
            .map_err(|_| anyhow::anyhow!("connecting to the relay timed out"))?
            .context("connecting to the relay")?;
        // lettre writes a message's closing `.` on its own after the content. With Nagle's
        // algorithm that write waits until the relay acknowledges the content, and a relay
        // waiting for the `.` delays its acknowledgement (40 ms on Linux): every message would
        // wait that long. Hence a socket of our own, for every kind of session.
        stream.set_nodelay(true).context("setting TCP_NODELAY")?;
        let mut connection = match &target.security {
            Security::Wrapped { config, name } => {
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name.clone(), stream)
                    .await
                    .context("TLS with the relay")?;
                AsyncSmtpConnection::connect_with_transport(Box::new(WrappedStream(tls)), &self.hello).await
            }
            Security::Plain | Security::StartTls(_) => {
                AsyncSmtpConnection::connect_with_transport(Box::new(stream), &self.hello).await
            }
        }
        .context("connecting to the relay")?;
        if let Security::StartTls(parameters) = &target.security {
            connection.starttls(parameters.clone(), &self.hello).await.context("STARTTLS")?;
        }
        // lettre keeps only the extensions it knows, and PIPELINING is not one: ask again
        // (EHLO may be repeated; it resets nothing a new session holds).
        let capabilities = connection.command(Ehlo::new(self.hello.clone())).await.context("EHLO")?;
        let pipelining = capabilities
            .message()
            .skip(1)
            .any(|line| line.split_whitespace().next().is_some_and(|word| word.eq_ignore_ascii_case("PIPELINING")));
        if let Some(credentials) = &target.credentials {
            connection.auth(&[Mechanism::Plain, Mechanism::Login], credentials).await.context("AUTH")?;
        }
        Ok(Session { connection, pipelining, idle_since: Instant::now() })
    }

    /// The most recently used pooled session young enough to reuse; older ones are closed.
    fn take_idle(&self) -> Option<Session> {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some(session) = idle.pop() {
            if session.idle_since.elapsed() < IDLE_MAX {
                return Some(session);
            }
            close(session);
        }
        None
    }

    fn put_idle(&self, mut session: Session) {
        session.idle_since = Instant::now();
        self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(session);
    }
}

impl Session {
    /// MAIL, RCPT and DATA, in one write where the relay pipelines; `Ok` once the relay
    /// waits for the content.
    async fn envelope(&mut self, envelope: &Envelope, bytes: &[u8]) -> Result<(), EnvelopeError> {
        let info = self.connection.server_info();
        let mut parameters = Vec::new();
        if !bytes.is_ascii() {
            if !info.supports_feature(Extension::EightBitMime) {
                return Err(EnvelopeError::Refused(unsupported(
                    "8-bit content, and the relay does not offer 8BITMIME",
                )));
            }
            parameters.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        let addresses = envelope.from().into_iter().chain(envelope.to());
        if addresses.map(AsRef::<str>::as_ref).any(|address| !address.is_ascii()) {
            if !info.supports_feature(Extension::SmtpUtfEight) {
                return Err(EnvelopeError::Refused(unsupported(
                    "an address beyond ASCII, and the relay does not offer SMTPUTF8",
                )));
            }
            parameters.push(MailParameter::SmtpUtfEight);
        }
        let mail = Mail::new(envelope.from().cloned(), parameters);
        let recipients: Vec<Rcpt> = envelope.to().iter().map(|to| Rcpt::new(to.clone(), Vec::new())).collect();
        let answered = if self.pipelining {
            let mut commands = mail.to_string();
            for recipient in &recipients {
                commands.push_str(&recipient.to_string());
            }
            commands.push_str(&Data.to_string());
            // The replies come in the order of the commands; the first refusal ends the
            // exchange and the session is dropped with the rest unread.
            let mut answered = self.connection.command(commands).await.map(drop);
            for _ in 0..=recipients.len() {
                if answered.is_err() {
                    break;
                }
                answered = self.connection.read_response().await.map(drop);
            }
            answered
        } else {
            let mut answered = self.connection.command(mail).await.map(drop);
            for recipient in recipients {
                if answered.is_err() {
                    break;
                }
                answered = self.connection.command(recipient).await.map(drop);
            }
            answered.and(self.connection.command(Data).await.map(drop))
        };
        answered.map_err(|error| match refused(&error) {
            Some(outcome) => EnvelopeError::Refused(outcome),
            None => EnvelopeError::Broken(error.to_string()),
        })
    }
}

/// A refusal by the relay (a 4xx or 5xx reply), or `None` for a broken exchange.
fn refused(error: &lettre::transport::smtp::Error) -> Option<Outcome> {
    (error.is_permanent() || error.is_transient()).then(|| Outcome::Rejected {
        permanent: error.is_permanent(),
        code: error.status().and_then(|code| code.to_string().parse().ok()),
        reply: error.to_string(),
    })
}

fn unsupported(what: &str) -> Outcome {
    Outcome::Rejected { permanent: true, code: None, reply: format!("the message has {what}") }
}

/// Says goodbye to a session off the sender's path.
fn close(mut session: Session) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = timeout(Duration::from_secs(1), session.connection.quit()).await;
        });
    }
}

/// The relay URL read as lettre reads it, and stricter: a URL whose TLS could fall back to
/// clear text is refused, and so is a CA file without TLS.
fn target(url: &str, ca_file: Option<&str>) -> anyhow::Result<Target> {
    let parsed = url::Url::parse(url).context("APP__EMAIL__RELAY_URL")?;
    let host = parsed.host_str().context("APP__EMAIL__RELAY_URL: no host")?.to_owned();
    let tls_query = parsed.query_pairs().find(|(key, _)| key == "tls").map(|(_, value)| value.into_owned());
    // Read only for a URL with TLS: without, the file is refused for that, below.
    let ca_pem = || {
        ca_file
            .map(|ca_file| {
                std::fs::read(ca_file).with_context(|| format!("APP__EMAIL__RELAY_CA_FILE: reading {ca_file}"))
            })
            .transpose()
    };
    let parameters = || -> anyhow::Result<TlsParameters> {
        let Some(pem) = &ca_pem()? else {
            return TlsParameters::new(host.clone()).context("APP__EMAIL__RELAY_URL: the TLS parameters");
        };
        let certificate = Certificate::from_pem(pem).context("APP__EMAIL__RELAY_CA_FILE: not a PEM certificate")?;
        TlsParameters::builder(host.clone())
            .add_root_certificate(certificate)
            .build_rustls()
            .context("APP__EMAIL__RELAY_CA_FILE: the TLS parameters")
    };
    let wrapped = || -> anyhow::Result<Security> {
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(pem) = &ca_pem()? {
            let certificates: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<_, _>>()
                .context("APP__EMAIL__RELAY_CA_FILE: not a PEM certificate")?;
            anyhow::ensure!(!certificates.is_empty(), "APP__EMAIL__RELAY_CA_FILE: not a PEM certificate");
            for certificate in certificates {
                roots.add(certificate).context("APP__EMAIL__RELAY_CA_FILE: the TLS parameters")?;
            }
        }
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("the TLS parameters")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(host.clone())
            .map_err(|_| anyhow::anyhow!("APP__EMAIL__RELAY_URL: {host:?} is not a name TLS can verify"))?;
        Ok(Security::Wrapped { config: Arc::new(config), name })
    };
    let (default_port, security) = match (parsed.scheme(), tls_query.as_deref()) {
        ("smtp", None) => {
            if ca_file.is_some() {
                anyhow::bail!(
                    "APP__EMAIL__RELAY_CA_FILE is set but the relay URL has no TLS (smtps:// or ?tls=required)"
                )
            }
            (25, Security::Plain)
        }
        ("smtp", Some("required")) => (587, Security::StartTls(parameters()?)),
        ("smtp", Some("opportunistic")) => anyhow::bail!(
            "APP__EMAIL__RELAY_URL: tls=opportunistic would send in clear text to a relay without STARTTLS; \
             use tls=required or smtps://"
        ),
        ("smtps", _) => (465, wrapped()?),
        (scheme, tls) => anyhow::bail!(
            "APP__EMAIL__RELAY_URL: unknown scheme {scheme:?} or tls={tls:?}: use smtp://, smtp://…?tls=required or smtps://"
        ),
    };
    let decoded = |text: &str| percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned();
    let credentials = parsed.password().map(|password| Credentials::new(decoded(parsed.username()), decoded(password)));
    Ok(Target { port: parsed.port().unwrap_or(default_port), host, security, credentials })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// What a fake relay saw: per session, every chunk it read, as text.
    type Seen = Arc<Mutex<Vec<Vec<String>>>>;

    #[derive(Clone, Copy)]
    enum Fake {
        /// Offers PIPELINING, and answers nothing of an envelope until it has MAIL, RCPT and
        /// DATA: a client that waits for MAIL's reply before sending RCPT never gets one.
        Pipelining,
        /// No PIPELINING: one command, one reply.
        Lockstep,
        /// Pipelining, and closes each session after its first message.
        OneMessagePerSession,
        /// Pipelining, and never answers the end of the content.
        SilentAfterContent,
        /// Refuses every session in its greeting.
        RefusesSessions,
    }

    async fn fake_relay(kind: Fake) -> (u16, Seen) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let port = listener.local_addr().expect("has an address").port();
        let seen: Seen = Arc::default();
        let sessions = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let index = {
                    let mut sessions = sessions.lock().expect("not poisoned");
                    sessions.push(Vec::new());
                    sessions.len() - 1
                };
                tokio::spawn(serve(stream, kind, sessions.clone(), index));
            }
        });
        (port, seen)
    }

    async fn serve(stream: TcpStream, kind: Fake, seen: Seen, index: usize) -> std::io::Result<()> {
        let record = |text: &str| seen.lock().expect("not poisoned")[index].push(text.to_owned());
        let (reader, mut writer) = stream.into_split();
        let mut reader = BufReader::new(reader);
        if matches!(kind, Fake::RefusesSessions) {
            record("<refused>");
            return writer.write_all(b"550 no mail from you\r\n").await;
        }
        writer.write_all(b"220 fake ESMTP\r\n").await?;
        let pipelining = !matches!(kind, Fake::Lockstep);
        let mut messages = 0;
        loop {
            // What one read brings: a pipelining client's envelope arrives as one chunk.
            let mut chunk = vec![0; 4096];
            let read = reader.read(&mut chunk).await?;
            if read == 0 {
                return Ok(());
            }
            let text = String::from_utf8_lossy(&chunk[..read]).into_owned();
            record(&text);
            let mut replies = String::new();
            let mut pending: Vec<String> = text.split_inclusive("\r\n").map(str::to_owned).collect();
            if pending.iter().any(|line| line.starts_with("MAIL")) && pipelining {
                // Wait for the whole envelope before answering any of it.
                while !pending.iter().any(|line| line.starts_with("DATA")) {
                    let mut line = String::new();
                    if reader.read_line(&mut line).await? == 0 {
                        return Ok(());
                    }
                    record(&line);
                    pending.push(line);
                }
            }
            for line in pending {
                let verb = line.split_whitespace().next().unwrap_or_default().to_ascii_uppercase();
                match verb.as_str() {
                    "EHLO" if pipelining => replies.push_str("250-fake\r\n250-8BITMIME\r\n250 PIPELINING\r\n"),
                    "EHLO" => replies.push_str("250-fake\r\n250 8BITMIME\r\n"),
                    "MAIL" | "RCPT" => replies.push_str("250 ok\r\n"),
                    "DATA" => {
                        writer.write_all(replies.as_bytes()).await?;
                        replies.clear();
                        writer.write_all(b"354 go on\r\n").await?;
                        let mut content = String::new();
                        while !content.ends_with("\r\n.\r\n") {
                            let mut line = String::new();
                            if reader.read_line(&mut line).await? == 0 {
                                return Ok(());
                            }
                            content.push_str(&line);
                        }
                        record("<content>");
                        if matches!(kind, Fake::SilentAfterContent) {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                        }
                        messages += 1;
                        writer.write_all(format!("250 queued as {messages}\r\n").as_bytes()).await?;
                        if matches!(kind, Fake::OneMessagePerSession) {
                            return Ok(());
                        }
                    }
                    "QUIT" => {
                        writer.write_all(b"221 bye\r\n").await?;
                        return Ok(());
                    }
                    _ => replies.push_str("250 ok\r\n"),
                }
            }
            writer.write_all(replies.as_bytes()).await?;
        }
    }

    fn relay(port: u16) -> Relay {
        Relay::new(&format!("smtp://127.0.0.1:{port}"), None, "sender.test", Duration::from_millis(500), 2)
            .expect("a valid URL")
    }

    fn message() -> (Envelope, Vec<u8>) {
        let envelope = Envelope::new(
            Some("bounce@sender.test".parse().expect("an address")),
            vec!["someone@example.com".parse().expect("an address")],
        )
        .expect("an envelope");
        (envelope, b"Subject: hi\r\n\r\nHello.\r\n".to_vec())
    }

    /// Sends `count` messages through one client to a fake relay of `kind`, each accepted,
    /// and gives what the relay saw.
    async fn send_accepted(kind: Fake, count: usize) -> Vec<Vec<String>> {
        let (port, seen) = fake_relay(kind).await;
        let relay = relay(port);
        let (envelope, bytes) = message();
        for _ in 0..count {
            let outcome = relay.send(&envelope, &bytes).await;
            assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
        }
        seen.lock().expect("not poisoned").clone()
    }

    #[tokio::test]
    async fn a_relay_that_pipelines_gets_each_envelope_in_one_write_and_warm_sessions_get_no_noop() {
        let sessions = send_accepted(Fake::Pipelining, 3).await;
        assert_eq!(sessions.len(), 1, "one session carries all three: {sessions:?}");
        let envelopes: Vec<&String> = sessions[0].iter().filter(|chunk| chunk.starts_with("MAIL")).collect();
        assert_eq!(envelopes.len(), 3, "{sessions:?}");
        for chunk in envelopes {
            assert_eq!(
                chunk.as_str(),
                "MAIL FROM:<bounce@sender.test>\r\nRCPT TO:<someone@example.com>\r\nDATA\r\n",
                "MAIL, RCPT and DATA in one write"
            );
        }
        assert!(!sessions[0].iter().any(|chunk| chunk.contains("NOOP")), "{sessions:?}");
    }

    #[tokio::test]
    async fn a_relay_that_does_not_pipeline_gets_one_command_at_a_time() {
        let sessions = send_accepted(Fake::Lockstep, 2).await;
        assert_eq!(sessions.len(), 1, "{sessions:?}");
        let commands: Vec<&String> = sessions[0].iter().filter(|chunk| *chunk != "<content>").collect();
        for chunk in &commands {
            assert_eq!(chunk.matches("\r\n").count(), 1, "one command per write: {chunk:?}");
        }
        let verbs: Vec<&str> = commands.iter().filter_map(|chunk| chunk.split_whitespace().next()).collect();
        assert_eq!(verbs, ["EHLO", "EHLO", "MAIL", "RCPT", "DATA", "MAIL", "RCPT", "DATA"], "{sessions:?}");
    }

    #[tokio::test]
    async fn a_session_the_relay_closed_while_pooled_is_replaced_and_the_message_sent_once() {
        let sessions = send_accepted(Fake::OneMessagePerSession, 3).await;
        let contents = sessions.iter().flatten().filter(|chunk| *chunk == "<content>").count();
        assert_eq!(contents, 3, "each message once: {sessions:?}");
        assert_eq!(sessions.len(), 3, "a new session for each after the relay closed the last");
    }

    #[tokio::test]
    async fn a_relay_silent_after_the_content_is_unknown_and_one_never_reached_is_unreachable() {
        let (port, _) = fake_relay(Fake::SilentAfterContent).await;
        let (envelope, bytes) = message();
        let started = Instant::now();
        let outcome = relay(port).send(&envelope, &bytes).await;
        assert!(matches!(outcome, Outcome::Unknown { .. }), "{outcome:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "bounded by the timeout");

        let closed = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let port = closed.local_addr().expect("has an address").port();
        drop(closed);
        let outcome = relay(port).send(&envelope, &bytes).await;
        assert!(matches!(outcome, Outcome::Unreachable { .. }), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_relay_that_refuses_the_session_is_unavailable_not_a_refusal_of_the_recipient() {
        let (port, seen) = fake_relay(Fake::RefusesSessions).await;
        let (envelope, bytes) = message();
        let outcome = relay(port).send(&envelope, &bytes).await;
        // A 550 here is the relay's, not the mailbox's: a `Rejected` would bounce the address.
        assert!(matches!(outcome, Outcome::Unreachable { .. }), "{outcome:?}");
        assert_eq!(seen.lock().expect("not poisoned").clone(), [["<refused>"]]);
    }

    #[test]
    fn a_url_whose_tls_could_fall_back_to_clear_text_is_refused() {
        let new = |url: &str| Relay::new(url, None, "h", Duration::from_secs(1), 1).map(drop);
        assert!(new("smtp://relay.test:2525?tls=opportunistic").is_err());
        assert!(new("ftp://relay.test").is_err());
        assert!(new("smtp://relay.test:2525?tls=required").is_ok());
        assert!(new("smtps://relay.test").is_ok());
        let with_ca = Relay::new("smtp://relay.test:25", Some("/nonexistent.pem"), "h", Duration::from_secs(1), 1);
        let refused = with_ca.err().map(|error| format!("{error:#}")).unwrap_or_default();
        assert!(refused.contains("has no TLS"), "a CA file without TLS: {refused}");
        let target = target("smtp://us%40er:p%3Ass@relay.test", None).expect("parses");
        assert_eq!(target.port, 25);
        assert!(target.credentials.is_some());
    }
}
