//! The email outbox worker. A send is handed to the relay inline by the command service; this
//! worker finishes what that left, in any number of processes:
//! - an email still `pending` after the grace period (the process that appended it died
//!   before its hand-off, or gave back the claim its append took, or the relay refused it
//!   for now; a released held email counts the grace from its release, its `next_attempt_at`):
//!   claimed under a lease, rebuilt
//!   from the log (its content opened with the contact's key) and handed off, with retries on
//!   the configured schedule while the relay refuses for now or cannot be reached;
//! - an email `attempting` whose lease ran out, or whose holder stopped beating (a hand-off
//!   died midway): the relay may have accepted it, so it is never sent again;
//!   `EmailOutcomeUnknown` is recorded.
//!
//! A pending email of a process that stopped beating (`platform::liveness`) is due at once,
//! not after the grace, and an attempting one is settled without waiting out its lease: the
//! work of a dead process is taken over within `DEAD_AFTER` and a poll.
//!
//! An email whose contact was erased before it left fails with `recipient_erased`.

use std::collections::HashMap;
use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::future::join_all;
use mail::mailer::Mailer;
use mail::outbox::{self, Handed, Lease, Parties, Prepared};
use platform::log::EventLog;
use platform::settings::Settings;
use uuid::Uuid;

use crate::runtime::{Outcome, Worker};

/// Emails handed off at once by one step.
const BATCH: i64 = 16;

/// Attempting emails whose lease ran out or whose holder is dead ($4: `DEAD_AFTER`), leased
/// to this process for their settling ($1 token, $2 lease seconds, $5 owner), at most $3.
static SETTLE_ABANDONED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE email_outbox o SET lease_token = $1, leased_until = now() + make_interval(secs => $2), owner = $5
         FROM (SELECT email_id FROM email_outbox
               WHERE state = 'attempting' AND (leased_until < now() OR {})
               ORDER BY leased_until LIMIT $3 FOR UPDATE SKIP LOCKED) due
         WHERE o.email_id = due.email_id
         RETURNING o.email_id, o.claim_scope_key, o.claim_token, o.attempts",
        platform::liveness::owner_is_dead("$4")
    )
});

/// Pending emails due: a retry whose time came, a first hand-off past the grace ($1 seconds)
/// the inline path has, or one whose appender is dead ($3: `DEAD_AFTER`); at most $2.
static DUE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT email_id FROM email_outbox
         WHERE state = 'pending' AND next_attempt_at <= now()
           AND (attempts > 0 OR created_at < now() - make_interval(secs => $1) OR {})
         ORDER BY next_attempt_at LIMIT $2",
        platform::liveness::owner_is_dead("$3")
    )
});

pub(crate) struct Outbox {
    pool: Pool,
    log: EventLog,
    mailer: Mailer,
    settings: platform::settings::EmailSettings,
    lease: Duration,
}

impl Outbox {
    pub(crate) fn new(pool: Pool, log: EventLog, settings: &Settings) -> anyhow::Result<Self> {
        Ok(Self {
            pool,
            log,
            mailer: Mailer::from_settings(&settings.email)?,
            settings: settings.email.clone(),
            lease: settings.email_lease(),
        })
    }

    async fn run(&self) -> anyhow::Result<Outcome> {
        let abandoned = self.settle_abandoned().await?;
        let due = self.claim_due().await?;
        let progressed = abandoned > 0 || !due.is_empty();
        let mut prepared = match self.prepare(&due).await {
            Ok(prepared) => prepared,
            Err(error) => {
                // Nothing was handed over: give the emails back rather than hold them to the
                // lease's end (a retry of a send would wait that long).
                join_all(due.iter().map(|lease| outbox::release(&self.pool, lease))).await;
                return Err(error);
            }
        };
        let handed = due.iter().map(|lease| self.hand_off(lease, prepared.remove(&lease.email_id)));
        join_all(handed).await.into_iter().collect::<anyhow::Result<()>>()?;
        Ok(if progressed { Outcome::Progressed } else { Outcome::Idle })
    }

    /// The claimed emails' messages, rebuilt from the log together, by email.
    async fn prepare(&self, due: &[Lease]) -> anyhow::Result<HashMap<String, Result<Prepared, Parties>>> {
        if due.is_empty() {
            return Ok(HashMap::new());
        }
        let email_ids: Vec<String> = due.iter().map(|lease| lease.email_id.clone()).collect();
        let mut client = self.pool.get().await?;
        let prepared = outbox::prepare_many_from_log(&mut client, &email_ids, &self.settings.public_base_url).await?;
        Ok(prepared
            .into_iter()
            .map(|prepared| {
                let email_id = match &prepared {
                    Ok(prepared) => prepared.parties.email_id.clone(),
                    Err(parties) => parties.email_id.clone(),
                };
                (email_id, prepared)
            })
            .collect())
    }

    /// Takes over hand-offs whose lease ran out or whose holder died, and records their
    /// outcome as unknown.
    async fn settle_abandoned(&self) -> anyhow::Result<usize> {
        let client = self.pool.get().await?;
        let token = Uuid::now_v7();
        let statement = client.prepare_cached(&SETTLE_ABANDONED).await?;
        let dead_after = platform::liveness::DEAD_AFTER.as_secs_f64();
        let owner = platform::liveness::process_id();
        // Settling is one append, so its lease is short: if this process loses the answer
        // of this statement, or its append stalls, another takes the email over within
        // seconds instead of after a hand-off's whole lease.
        let settle_lease = platform::liveness::DEAD_AFTER.as_secs_f64();
        let rows = client.query(&statement, &[&token, &settle_lease, &BATCH, &dead_after, &owner]).await?;
        drop(client);
        for row in &rows {
            let lease = Lease {
                email_id: row.get(0),
                token,
                claim: row.get::<_, Option<String>>(1).zip(row.get::<_, Option<Uuid>>(2)),
                attempts: row.get(3),
            };
            let parties = self.parties(&lease.email_id).await?;
            let event = outbox::unknown(
                &parties,
                "the hand-off stopped before its outcome was recorded; the relay may have accepted the message",
                platform::time::now_millis(),
            );
            if let Err(error) = outbox::record(&self.log, &parties, &lease, event).await {
                tracing::warn!(error = %error, email = %lease.email_id, "could not record an abandoned hand-off");
            }
        }
        Ok(rows.len())
    }

    async fn parties(&self, email_id: &str) -> anyhow::Result<Parties> {
        let client = self.pool.get().await?;
        outbox::parties_from_log(&client, email_id).await
    }

    /// Claims due `pending` emails: first hand-offs past the grace period the inline path
    /// has, and retries whose time has come.
    async fn claim_due(&self) -> anyhow::Result<Vec<Lease>> {
        let client = self.pool.get().await?;
        let grace = Duration::from_millis(self.settings.handoff_grace_ms).as_secs_f64();
        let statement = client.prepare_cached(&DUE).await?;
        let dead_after = platform::liveness::DEAD_AFTER.as_secs_f64();
        let email_ids: Vec<String> =
            client.query(&statement, &[&grace, &BATCH, &dead_after]).await?.into_iter().map(|row| row.get(0)).collect();
        drop(client);
        outbox::claim_many(&self.pool, &email_ids, self.lease).await
    }

    /// Hands off the email of `lease`, as `prepared` rebuilt it (`None`: it could not be
    /// rebuilt, and it is given back for a later attempt, on the retry schedule).
    async fn hand_off(&self, lease: &Lease, prepared: Option<Result<Prepared, Parties>>) -> anyhow::Result<()> {
        let Some(prepared) = prepared else {
            // Not this step's failure: the other emails went on, and failing the step would
            // hold every later one back by the worker's backoff while this one came back
            // first in each step.
            let schedule = &self.settings.retry_schedule_ms;
            outbox::defer(&self.pool, lease, schedule, "the email could not be rebuilt from the log").await?;
            metrics::counter!("email_outbox_unbuildable_total").increment(1);
            tracing::error!(email = %lease.email_id, attempts = lease.attempts + 1, "an email could not be rebuilt from the log; deferred");
            return Ok(());
        };
        match prepared {
            Ok(prepared) => {
                let schedule = Some(self.settings.retry_schedule_ms.as_slice());
                let handed = outbox::hand_off(&self.pool, &self.log, &self.mailer, lease, &prepared, schedule).await;
                if handed == Handed::Lost {
                    tracing::warn!(email = %lease.email_id, "an outbox hand-off lost its lease");
                }
            }
            Err(parties) => {
                let event = outbox::erased(&parties, platform::time::now_millis());
                outbox::record(&self.log, &parties, lease, event).await?;
            }
        }
        Ok(())
    }
}

impl Worker for Outbox {
    fn name(&self) -> String {
        "email_outbox".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.settings.outbox_poll_ms.max(10))
    }

    fn step(&self) -> futures_util::future::BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(self.run())
    }

    fn lag(&self) -> futures_util::future::BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async {
            let client = self.pool.get().await?;
            let due: i64 = client
                .query_one("SELECT count(*) FROM email_outbox WHERE state IN ('pending', 'attempting')", &[])
                .await?
                .get(0);
            metrics::gauge!("email_outbox_open").set(due as f64);
            Ok(None)
        })
    }
}
