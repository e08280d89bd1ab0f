//! The inbound listener (`projector inbound`): an SMTP server for the return paths, which
//! receives the bounces (delivery status notifications) and complaints (feedback reports)
//! that come back for the mail we send, and records them ([`record`]).
//!
//! - Only recipients at a return-path domain of some authored domain are accepted; any other
//!   is refused (550 5.7.1): it relays nothing.
//! - A message is acknowledged (250) only once what it reports is appended; when that fails
//!   it is refused for now (451), so the sender keeps it and tries again. A report appended
//!   whose acknowledgement was lost is recorded once when it comes again (its digest).
//! - Mail that is not a report, or names an email the log does not hold, is accepted and
//!   dropped: logged and counted (`inbound_messages_total{outcome}`), never refused, so no
//!   sender retries it forever.
//! - Messages larger than `APP__INBOUND__MAX_MESSAGE_BYTES` are refused (552) without being
//!   held in memory; sessions idle for `IDLE_TIMEOUT_SECONDS` are closed.
//!
//! Commands are parsed by `smtp-proto` (Stalwart's SMTP parser); the listener does the I/O.

pub mod feedback;
pub mod record;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use deadpool_postgres::Pool;
use platform::log::EventLog;
use platform::settings::{InboundSettings, Settings};
use smtp_proto::request::receiver::{DataReceiver, DummyDataReceiver, RequestReceiver};
use smtp_proto::{Error as ProtoError, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use record::{Recorded, Recorder};

/// Recipients kept per transaction at most.
const MAX_RECIPIENTS: usize = 20;

/// The SMTP listener, bound.
pub struct Listener {
    listener: TcpListener,
    shared: Arc<Shared>,
}

struct Shared {
    pool: Pool,
    recorder: Recorder,
    settings: InboundSettings,
    sessions: Arc<tokio::sync::Semaphore>,
}

impl Listener {
    /// Binds `APP__INBOUND__HOST`:`port`.
    pub async fn bind(pool: Pool, log: EventLog, settings: &InboundSettings, port: u16) -> anyhow::Result<Self> {
        // Counters are recorded from the start, before the first scrape.
        api::ops::metrics_handle();
        let listener = TcpListener::bind((settings.host.as_str(), port))
            .await
            .with_context(|| format!("binding the inbound listener to {}:{port}", settings.host))?;
        let shared = Arc::new(Shared {
            recorder: Recorder::new(pool.clone(), log, settings),
            sessions: Arc::new(tokio::sync::Semaphore::new(settings.max_connections.max(1))),
            settings: settings.clone(),
            pool,
        });
        Ok(Self { listener, shared })
    }

    /// The SMTP port.
    pub fn port(&self) -> anyhow::Result<u16> {
        Ok(self.listener.local_addr()?.port())
    }

    /// Serves until `shutdown`; sessions in progress go on until they end (or the process).
    pub async fn serve(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self { listener, shared } = self;
        loop {
            let permit = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                permit = Arc::clone(&shared.sessions).acquire_owned() => permit?,
            };
            let accepted = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(error = %error, "inbound accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                if let Err(error) = Session::new(&shared, stream).run().await {
                    tracing::debug!(error = %format!("{error:#}"), peer = %peer, "inbound session ended");
                }
                drop(permit);
            });
        }
    }
}

/// The `projector inbound` process: the listener and the operations endpoints (health,
/// metrics) on `APP__PROJECTOR__PORT`.
pub struct Inbound {
    listener: Listener,
    server: actix_web::dev::Server,
    ops_port: u16,
}

impl Inbound {
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        let pool = platform::db::pool(settings.database_url()?, 8)?;
        let log = EventLog::start_own(
            settings.database_url()?,
            false,
            (settings.append.batch_max, settings.append.batch_bytes),
        )?;
        let port = settings.inbound.port.unwrap_or(DEFAULT_PORT);
        let listener = Listener::bind(pool.clone(), log, &settings.inbound, port).await?;
        let (server, ops_port) = crate::ops_server(settings, api::ops::Ops::new(pool, None))?;
        Ok(Self { listener, server, ops_port })
    }

    /// The SMTP port.
    pub fn port(&self) -> anyhow::Result<u16> {
        self.listener.port()
    }

    /// The port of the operations endpoints.
    pub fn ops_port(&self) -> u16 {
        self.ops_port
    }

    /// Serves until SIGTERM or SIGINT (which stop the operations server).
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Self { listener, server, .. } = self;
        let shutdown = CancellationToken::new();
        let serving = tokio::spawn(listener.serve(shutdown.clone()));
        let served = server.await;
        shutdown.cancel();
        serving.await??;
        Ok(served?)
    }
}

/// The port `projector inbound` binds when `APP__INBOUND__PORT` is unset.
pub(crate) const DEFAULT_PORT: u16 = 2525;

/// One SMTP session.
struct Session<'a> {
    shared: &'a Shared,
    stream: TcpStream,
    /// Bytes read and not yet parsed.
    input: Vec<u8>,
    offset: usize,
    /// The transaction: whether MAIL FROM was given, and the accepted recipients.
    mail: bool,
    recipients: Vec<String>,
}

impl<'a> Session<'a> {
    fn new(shared: &'a Shared, stream: TcpStream) -> Self {
        Self { shared, stream, input: Vec::new(), offset: 0, mail: false, recipients: Vec::new() }
    }

    fn settings(&self) -> &InboundSettings {
        &self.shared.settings
    }

    async fn reply(&mut self, text: &str) -> anyhow::Result<()> {
        self.stream.write_all(text.as_bytes()).await?;
        self.stream.write_all(b"\r\n").await?;
        Ok(())
    }

    /// Reads more input; `false` when the client closed the connection.
    async fn fill(&mut self) -> anyhow::Result<bool> {
        if self.offset > 0 {
            self.input.drain(..self.offset);
            self.offset = 0;
        }
        let idle = Duration::from_secs(self.settings().idle_timeout_seconds.max(1));
        let mut chunk = [0_u8; 16 * 1024];
        match tokio::time::timeout(idle, self.stream.read(&mut chunk)).await {
            Ok(read) => {
                let read = read?;
                self.input.extend_from_slice(&chunk[..read]);
                Ok(read > 0)
            }
            Err(_) => {
                let hostname = self.settings().hostname.clone();
                self.reply(&format!("421 4.4.2 {hostname} idle too long, closing")).await?;
                Ok(false)
            }
        }
    }

    async fn run(mut self) -> anyhow::Result<()> {
        let hostname = self.settings().hostname.clone();
        self.reply(&format!("220 {hostname} ESMTP return-path listener")).await?;
        let mut receiver = RequestReceiver::default();
        loop {
            let parsed = {
                let mut bytes = self.input[self.offset..].iter();
                let before = bytes.len();
                let parsed = receiver.ingest(&mut bytes).map(|request| request.into_owned_request());
                self.offset += before - bytes.len();
                parsed
            };
            let request = match parsed {
                Ok(request) => request,
                Err(ProtoError::NeedsMoreData { .. }) => {
                    if !self.fill().await? {
                        return Ok(());
                    }
                    continue;
                }
                Err(ProtoError::ResponseTooLong) => {
                    self.reply("500 5.5.2 line too long").await?;
                    continue;
                }
                Err(ProtoError::UnknownCommand) => {
                    self.reply("500 5.5.1 command not recognized").await?;
                    continue;
                }
                Err(error) => {
                    self.reply(&format!("501 5.5.4 {}", describe(&error))).await?;
                    continue;
                }
            };
            match request {
                Owned::Ehlo => {
                    self.reset();
                    let max = self.settings().max_message_bytes;
                    self.reply(&format!(
                        "250-{hostname}\r\n250-SIZE {max}\r\n250-8BITMIME\r\n250-ENHANCEDSTATUSCODES\r\n250 PIPELINING"
                    ))
                    .await?;
                }
                Owned::Helo => {
                    self.reset();
                    self.reply(&format!("250 {hostname}")).await?;
                }
                Owned::Mail { size } => {
                    if self.mail {
                        self.reply("503 5.5.1 nested MAIL command").await?;
                    } else if size > self.settings().max_message_bytes {
                        self.reply("552 5.3.4 message too big").await?;
                    } else {
                        self.mail = true;
                        self.reply("250 2.1.0 ok").await?;
                    }
                }
                Owned::Rcpt { address } => {
                    if !self.mail {
                        self.reply("503 5.5.1 MAIL first").await?;
                    } else if self.recipients.len() >= MAX_RECIPIENTS {
                        self.reply("452 4.5.3 too many recipients").await?;
                    } else {
                        match self.accepts(&address).await {
                            Ok(true) => {
                                self.recipients.push(address);
                                self.reply("250 2.1.5 ok").await?;
                            }
                            Ok(false) => self.reply("550 5.7.1 relaying denied").await?,
                            Err(error) => {
                                tracing::warn!(error = %format!("{error:#}"), "inbound recipient check failed");
                                self.reply("451 4.3.0 try again later").await?;
                            }
                        }
                    }
                }
                Owned::Data => {
                    if !self.mail || self.recipients.is_empty() {
                        self.reply("503 5.5.1 RCPT first").await?;
                        continue;
                    }
                    self.reply("354 end data with <CR><LF>.<CR><LF>").await?;
                    let Some(message) = self.read_data().await? else { return Ok(()) };
                    let reply = match message {
                        Data::TooBig => "552 5.3.4 message too big".to_owned(),
                        Data::Message(raw) => self.receive(&raw).await,
                    };
                    self.reset();
                    self.reply(&reply).await?;
                }
                Owned::Rset => {
                    self.reset();
                    self.reply("250 2.0.0 ok").await?;
                }
                Owned::Noop => self.reply("250 2.0.0 ok").await?,
                Owned::Vrfy => self.reply("252 2.1.5 cannot verify").await?,
                Owned::Quit => {
                    self.reply("221 2.0.0 bye").await?;
                    return Ok(());
                }
                Owned::NotOffered(name) => self.reply(&format!("502 5.5.1 {name} not offered")).await?,
            }
        }
    }

    fn reset(&mut self) {
        self.mail = false;
        self.recipients.clear();
    }

    /// Whether `address` is at the return-path domain of an authored domain.
    async fn accepts(&self, address: &str) -> anyhow::Result<bool> {
        let Some((local, domain)) = address.rsplit_once('@') else { return Ok(false) };
        if local.is_empty() || domain.is_empty() {
            return Ok(false);
        }
        let client = self.shared.pool.get().await?;
        let Some(catalog) = platform::readmodel::live_schema(&client, "catalog").await? else {
            anyhow::bail!("the catalog is not built yet");
        };
        let statement = format!(
            "SELECT EXISTS (SELECT 1 FROM {catalog}.resources WHERE kind = $1 AND lower(definition ->> 'returnPath') = $2)"
        );
        let row = client.query_one(&statement, &[&domain::email::resources::DOMAIN, &domain.to_lowercase()]).await?;
        Ok(row.get(0))
    }

    /// The message after DATA, dot-unstuffed; `None` when the client went away first.
    async fn read_data(&mut self) -> anyhow::Result<Option<Data>> {
        let max = self.settings().max_message_bytes;
        let mut receiver = DataReceiver::new();
        let mut message = Vec::new();
        loop {
            let done = {
                let mut bytes = self.input[self.offset..].iter();
                let before = bytes.len();
                let done = receiver.ingest(&mut bytes, &mut message);
                self.offset += before - bytes.len();
                done
            };
            if done {
                return Ok(Some(if message.len() > max { Data::TooBig } else { Data::Message(message) }));
            }
            if message.len() > max {
                // Read the rest without keeping it.
                let mut discard = DummyDataReceiver::new_data(&receiver);
                loop {
                    let done = {
                        let mut bytes = self.input[self.offset..].iter();
                        let before = bytes.len();
                        let done = discard.ingest(&mut bytes);
                        self.offset += before - bytes.len();
                        done
                    };
                    if done {
                        return Ok(Some(Data::TooBig));
                    }
                    if !self.fill().await? {
                        return Ok(None);
                    }
                }
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// Records what `raw` reports; the reply to the end of DATA.
    async fn receive(&self, raw: &[u8]) -> String {
        let recipient = self
            .recipients
            .iter()
            .find(|recipient| crate::inbound::feedback::email_of_recipient(recipient).is_some())
            .or_else(|| self.recipients.first())
            .cloned()
            .unwrap_or_default();
        match self.shared.recorder.record(raw, &recipient).await {
            Ok(recorded) => {
                metrics::counter!("inbound_messages_total", "outcome" => recorded.label()).increment(1);
                match recorded {
                    Recorded::Report(kind) => tracing::info!(kind, "inbound report recorded"),
                    other => tracing::info!(outcome = other.label(), bytes = raw.len(), "inbound message dropped"),
                }
                let pause = self.settings().pause_before_reply_ms;
                if pause > 0 {
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                "250 2.0.0 ok".to_owned()
            }
            Err(error) => {
                metrics::counter!("inbound_messages_total", "outcome" => "deferred").increment(1);
                tracing::warn!(error = %format!("{error:#}"), "an inbound report could not be recorded");
                "451 4.3.0 try again later".to_owned()
            }
        }
    }
}

enum Data {
    Message(Vec<u8>),
    TooBig,
}

/// The commands a session acts on, owned.
enum Owned {
    Ehlo,
    Helo,
    Mail { size: usize },
    Rcpt { address: String },
    Data,
    Rset,
    Noop,
    Vrfy,
    Quit,
    NotOffered(&'static str),
}

trait IntoOwned {
    fn into_owned_request(self) -> Owned;
}

impl IntoOwned for Request<std::borrow::Cow<'_, str>> {
    fn into_owned_request(self) -> Owned {
        match self {
            Request::Ehlo { .. } | Request::Lhlo { .. } => Owned::Ehlo,
            Request::Helo { .. } => Owned::Helo,
            Request::Mail { from } => Owned::Mail { size: from.size },
            Request::Rcpt { to } => Owned::Rcpt { address: to.address.into_owned() },
            Request::Data => Owned::Data,
            Request::Rset => Owned::Rset,
            Request::Noop { .. } => Owned::Noop,
            Request::Vrfy { .. } => Owned::Vrfy,
            Request::Quit => Owned::Quit,
            other => Owned::NotOffered(other.name()),
        }
    }
}

fn describe(error: &ProtoError) -> String {
    match error {
        ProtoError::InvalidSenderAddress => "invalid sender address".to_owned(),
        ProtoError::InvalidRecipientAddress => "invalid recipient address".to_owned(),
        ProtoError::SyntaxError { syntax } => format!("syntax: {syntax}"),
        ProtoError::InvalidParameter { param } => format!("invalid parameter {param}"),
        ProtoError::UnsupportedParameter { param } => format!("unsupported parameter {param}"),
        _ => "syntax error".to_owned(),
    }
}
