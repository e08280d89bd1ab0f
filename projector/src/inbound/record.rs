//! Records what a report received at a return path says: `EmailBounced{source: dsn}` or
//! `EmailComplained` on the email's stream, and the suppression it earns, in one append with
//! the report's digest (so a report delivered twice is recorded once).
//!
//! - A hard bounce suppresses the address (reason `bounce`, source `provider`).
//! - A soft bounce counts against the address; soft bounces of `soft_bounce_limit` different
//!   emails within the window suppress it (reason `bounce`).
//! - A complaint suppresses it (reason `complaint`).
//!
//! The address is the one the email was sent to, opened from its sealed content, never one a
//! report names (anyone can send a report; only the email's id, which only the recipient's
//! mail system has seen, ties it to a mailbox). An email whose contact was erased is still
//! recorded, without a suppression: its address is gone.

use std::time::Duration;

use crate::inbound::feedback::Report;
use deadpool_postgres::Pool;
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, AppendRequest, EventLog, ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto;
use sha2::{Digest, Sha256};

/// What became of a received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded: `hard_bounce`, `soft_bounce` or `complaint`.
    Report(&'static str),
    /// The same report was recorded before.
    Duplicate,
    /// A report about an email the log does not hold.
    UnknownEmail,
    /// Not a report (or one that reports nothing), and why.
    Ignored(&'static str),
}

impl Recorded {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Report(kind) => kind,
            Self::Duplicate => "duplicate",
            Self::UnknownEmail => "unknown_email",
            Self::Ignored(reason) => reason,
        }
    }
}

pub(crate) struct Recorder {
    pool: Pool,
    log: EventLog,
    soft_limit: i64,
    soft_window: Duration,
}

/// The email a report is about, as its scheduling recorded it.
struct Email {
    space_id: String,
    contact_id: String,
    /// `None` when its contact was erased.
    address: Option<String>,
}

impl Recorder {
    pub(crate) fn new(pool: Pool, log: EventLog, settings: &platform::settings::InboundSettings) -> Self {
        Self {
            pool,
            log,
            soft_limit: settings.soft_bounce_limit.max(1),
            soft_window: Duration::from_secs(settings.soft_bounce_window_seconds),
        }
    }

    /// Reads `raw`, received for `recipient`, and records what it reports. An error means
    /// nothing was recorded (the sender should try again later).
    pub(crate) async fn record(&self, raw: &[u8], recipient: &str) -> anyhow::Result<Recorded> {
        let report = crate::inbound::feedback::parse(raw, recipient);
        let email_id = match &report {
            Report::Bounce { email_id, .. } | Report::Complaint { email_id, .. } => email_id.clone(),
            Report::Ignored(reason) => return Ok(Recorded::Ignored(reason)),
        };
        let Some(email) = self.email(&email_id).await? else { return Ok(Recorded::UnknownEmail) };
        let digest = hex::encode(Sha256::digest(raw));
        let (kind, reason) = match &report {
            Report::Bounce { hard: true, .. } => ("hard_bounce", Some("bounce")),
            Report::Bounce { hard: false, .. } => ("soft_bounce", None),
            _ => ("complaint", Some("complaint")),
        };
        let address_digest = match &email.address {
            Some(address) => Some(platform::crypto::keyed_digest("soft-bounce", &address.to_lowercase())?),
            None => None,
        };
        let reason = match (reason, &address_digest) {
            (Some(reason), _) => Some(reason),
            (None, Some(address_digest)) => {
                self.soft_limit_reached(&email.space_id, address_digest, &email_id).await?.then_some("bounce")
            }
            (None, None) => None,
        };
        let suppress = email.address.as_deref().zip(reason);
        let appended =
            self.append(&report, &email, (&email_id, &digest, kind), address_digest.as_deref(), suppress).await;
        let appended = match appended {
            // The address was suppressed for that reason already: the report without it.
            Err(AppendError::Conflict { code: Code::SuppressionAlreadyExists, .. }) => {
                self.append(&report, &email, (&email_id, &digest, kind), address_digest.as_deref(), None).await
            }
            other => other,
        };
        match appended {
            Ok(_) => Ok(Recorded::Report(kind)),
            Err(AppendError::Conflict { code: Code::IdempotencyConflict, .. }) => Ok(Recorded::Duplicate),
            Err(error) => Err(anyhow::anyhow!("recording a {kind} of {email_id}: {error}")),
        }
    }

    async fn email(&self, email_id: &str) -> anyhow::Result<Option<Email>> {
        let client = self.pool.get().await?;
        let Some(scheduled) = mail::outbox::scheduled_event(&client, email_id).await? else {
            return Ok(None);
        };
        let keys = platform::crypto::load_keys(&client, std::slice::from_ref(&scheduled.contact_id)).await?;
        let content: Option<proto::EmailContent> = platform::events::open(scheduled.content.as_ref(), &keys)?;
        Ok(Some(Email {
            space_id: scheduled.space_id,
            contact_id: scheduled.contact_id,
            address: content.map(|content| content.to_address),
        }))
    }

    /// Whether this soft bounce makes `soft_limit` different emails to the address within
    /// the window.
    async fn soft_limit_reached(&self, space_id: &str, address_digest: &str, email_id: &str) -> anyhow::Result<bool> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "SELECT count(*) FROM soft_bounces
                 WHERE space_id = $1 AND address_digest = $2 AND email_id <> $3
                   AND bounced_at > now() - make_interval(secs => $4)",
                &[&space_id, &address_digest, &email_id, &self.soft_window.as_secs_f64()],
            )
            .await?;
        Ok(row.get::<_, i64>(0) + 1 >= self.soft_limit)
    }

    async fn append(
        &self,
        report: &Report,
        email: &Email,
        (email_id, digest, kind): (&str, &str, &'static str),
        address_digest: Option<&str>,
        suppress: Option<(&str, &str)>,
    ) -> Result<platform::log::Appended, AppendError> {
        let now = chrono::Utc::now();
        let at_ms = now.timestamp_millis();
        let event = match report {
            Report::Bounce { hard, status, diagnostic, .. } => LogEvent::EmailBounced(proto::EmailBounced {
                email_id: email_id.to_owned(),
                space_id: email.space_id.clone(),
                contact_id: email.contact_id.clone(),
                kind: if *hard { "hard" } else { "soft" }.to_owned(),
                diagnostic: diagnostic.clone(),
                at_ms,
                status: status.clone(),
                source: "dsn".to_owned(),
            }),
            Report::Complaint { feedback_type, reporter, .. } => LogEvent::EmailComplained(proto::EmailComplained {
                email_id: email_id.to_owned(),
                space_id: email.space_id.clone(),
                contact_id: email.contact_id.clone(),
                feedback_type: feedback_type.clone(),
                reporter: reporter.clone(),
                at_ms,
            }),
            Report::Ignored(_) => return Err(AppendError::Failed("nothing to record".to_owned())),
        };
        let mut guards = vec![Guard::unique(
            "INSERT INTO inbound_reports (digest, email_id, kind) VALUES ($1, $2, $3)",
            vec![Box::new(digest.to_owned()), Box::new(email_id.to_owned()), Box::new(kind)],
            AppendError::Conflict { code: Code::IdempotencyConflict, message: "this report was recorded".to_owned() },
        )];
        if let (Report::Bounce { hard: false, .. }, Some(address_digest)) = (report, address_digest) {
            guards.push(Guard::unique(
                "INSERT INTO soft_bounces (space_id, address_digest, email_id) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
                vec![
                    Box::new(email.space_id.clone()),
                    Box::new(address_digest.to_owned()),
                    Box::new(email_id.to_owned()),
                ],
                AppendError::Failed("could not count the soft bounce".to_owned()),
            ));
        }
        let mut streams = vec![StreamAppend {
            stream_id: domain::email::stream_id(email_id),
            expected: ExpectedVersion::Any,
            events: vec![NewEvent { event, subject_id: Some(email.contact_id.clone()), occurred_at: now }],
        }];
        if let Some((address, reason)) = suppress {
            let (stream, guard) = mail::outbox::provider_suppression(&email.space_id, address, reason, now)?;
            streams.push(stream);
            guards.push(guard);
        }
        self.log.append(AppendRequest::in_space(&email.space_id, streams, guards)).await
    }
}
