//! The webhook delivery engine: `enqueue` follows the log and fills the outbox, `deliver`
//! attempts due deliveries, signs them, retries them and keeps each webhook's counters.
//!
//! # Webhook delivery
//!
//! The webhook resource lives in the log (stream `webhook-<id>`: `WebhookCreated`, `Updated`,
//! `Paused`, `SecretRotated`, `Deleted`), folded by `domain::webhooks::state` for decisions, for
//! the `webhooks` read model and for the engine. Two workers deliver (`projector/src/workers/
//! webhooks/`):
//!
//! - **Enqueue** (lease `webhook_enqueue`) follows the log. In one transaction per batch it
//!   folds the webhook events into `webhook_endpoints` and `webhook_secrets`, matches every
//!   other event against the webhooks live at its position (trigger, schema, custom filter),
//!   inserts one outbox row per match into `webhook_deliveries`, and advances its checkpoint.
//!   The delivery id is `msg_` + a digest of (log position, webhook id): a batch run twice
//!   inserts nothing, and the id is the stable `webhook-id` receivers deduplicate on. The row
//!   captures the URL and the secret version; the body (`{type, timestamp, data}`) is sealed
//!   under the data key of the event's subject, so erasing a contact shreds its queued and sent
//!   payloads. A delivery a filter rejects is never enqueued, sent or counted. An event no live
//!   webhook of its space listens for (by trigger, and an email event's type) is passed over
//!   before its occurrence is built, so a broadcast in a space without `email event` webhooks
//!   costs the worker no read of each email's template.
//! - **Deliver** (any number of processes) claims due rows in a short transaction, serialised
//!   between processes by an advisory lock so that at most `PER_WEBHOOK_CONCURRENCY` (8)
//!   attempts of one webhook are in flight fleet-wide, and leases each (timeout plus as much
//!   again, at most 30 s more). Each attempt runs in a task of its own (at most `CONCURRENCY`,
//!   64, per process), so a slow receiver holds back only its own webhook. It signs with the
//!   captured secret (and, during a rotation's grace period, the one on the other side of it),
//!   POSTs with a 15 s timeout, and hands the outcome to the process's recorder, which writes
//!   the outcomes of every attempt that ended meanwhile in one statement (and one commit): each
//!   delivery's next state, its attempt (for the delivery log) and the webhooks' counters, each
//!   row only if its lease token still matches. The attempt's slot is freed once that commit
//!   is done. A claim's commit does not wait for the disk (`synchronous_commit = off`): a
//!   claim lost in a database crash only lets its deliveries be claimed again. A process that
//!   dies mid-attempt leaves leases that expire; another process attempts again. That is the
//!   only way a receiver sees a delivery twice after answering 2xx.
//! - **Retries** follow `RETRY_SCHEDULE_MS` (Svix's: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h,
//!   ±20% jitter) for network errors, timeouts, 408, 429 (at least its `Retry-After`) and 5xx;
//!   other answers fail at once. A 410 appends `WebhookPaused{gone}` before the outcome is
//!   recorded. The circuit breaker appends `WebhookPaused{failing}` after `BREAKER_FAILURES`
//!   (20) consecutive failed attempts spanning at least `BREAKER_WINDOW_SECONDS` (24 h); a
//!   PATCH to `live` clears the run. A claimed delivery whose webhook is paused or deleted, or
//!   whose subject was erased, is dropped (`state = 'dropped'`), not held.
//! - **The owner's tools.** `GET /webhooks/{id}/deliveries` reads the outbox and its attempts
//!   (cursor pages, newest first; never a body or a secret). `POST .../deliveries/{id}/replay`
//!   appends `WebhookDeliveryReplayRequested`, and the enqueue worker puts the delivery back
//!   in the outbox, due now, with the same id and body, the URL and secret of now, and its
//!   retry schedule restarted.
//!   `POST /webhooks/{id}/test` appends `WebhookTestRequested`, and the enqueue worker
//!   enqueues one `webhook.test` delivery.
//! - **Targets.** `domain::webhooks::target` refuses loopback (unless `ALLOW_LOOPBACK`),
//!   private, link-local, shared, metadata and special-purpose addresses at create and update,
//!   and again at connect time: the client's resolver refuses a host any of whose addresses is
//!   refused (DNS rebinding), redirects are not followed, and literal addresses are checked
//!   before sending.

mod decide;
pub mod deliver;
pub mod enqueue;
