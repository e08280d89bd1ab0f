//! The delivery's decisions: how a claimed delivery is sent (or why it is dropped), its state
//! after an attempt, and the pause of a webhook whose receiver is gone or failing. Pure: the
//! worker loads the secrets and keys, draws the jitter and reads the clock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use domain::webhooks::signing::Secret;
use domain::webhooks::state::stream_id;
use platform::crypto::Keys;
use platform::events::LogEvent;
use platform::log::{ExpectedVersion, NewEvent, StreamAppend};
use platform::proto;

use crate::workers::outbound::AttemptResult;

/// A webhook's secret of one version, and until when it still signs as the previous secret
/// of a rotation (set on the version that replaced it).
pub(super) type VersionedSecret = (i32, Secret, Option<DateTime<Utc>>);

pub(super) enum Plan {
    /// Send `body`, signed with `secrets`.
    Send { body: Vec<u8>, secrets: Vec<Secret> },
    /// Not sent, for this reason.
    Drop(&'static str),
}

/// How to send a claimed delivery of a live webhook, or why not: its body opens with its
/// subject's key (gone once the subject is erased), and it is signed with the secret captured
/// at enqueue plus, during a rotation's grace period (at `now`), the one on the other side of
/// it.
pub(super) fn plan_send(
    keys: &Keys,
    subject: Option<&str>,
    body: Vec<u8>,
    secrets: Option<&Vec<VersionedSecret>>,
    version: i32,
    now: DateTime<Utc>,
) -> Plan {
    let body = match subject {
        None => body,
        Some(subject) => match keys.get(subject).map(|key| key.decrypt(subject, &body)) {
            Some(Ok(body)) => body,
            Some(Err(_)) => return Plan::Drop("the payload could not be opened"),
            None => return Plan::Drop("the data subject was erased"),
        },
    };
    let Some(secrets) = secrets else { return Plan::Drop("the webhook's secrets are gone") };
    let in_grace = |until: &Option<DateTime<Utc>>| until.is_some_and(|until| until > now);
    let mut chosen = Vec::new();
    for (secret_version, secret, previous_valid_until) in secrets {
        let captured = *secret_version == version;
        // The secret that replaced the captured one, while the captured one is still valid.
        let newer = *secret_version == version + 1 && in_grace(previous_valid_until);
        // The captured secret replaced an older one that is still valid.
        let older =
            *secret_version == version - 1 && secrets.iter().any(|(v, _, until)| *v == version && in_grace(until));
        if captured {
            chosen.insert(0, secret.clone());
        } else if newer || older {
            chosen.push(secret.clone());
        }
    }
    if chosen.is_empty() {
        return Plan::Drop("the webhook's secrets are gone");
    }
    Plan::Send { body, secrets: chosen }
}

/// A delivery's state after an attempt.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Next {
    /// `delivered`, `pending` (attempted again after `delay`) or `failed`.
    pub state: &'static str,
    pub delay: Option<Duration>,
    /// The receiver's status and the error to record.
    pub status: Option<u16>,
    pub error: Option<String>,
}

/// The delivery's state after an attempt that was its `retry`-th retry (0 for the first
/// attempt since the owner's latest replay): a retryable failure waits the schedule's delay
/// for it, scaled by `jitter` (drawn by the worker in 0.8..1.2), or longer when the receiver
/// asked; past the schedule it has failed.
pub(super) fn next_state(schedule_ms: &[u64], retry: usize, result: &AttemptResult, jitter: f64) -> Next {
    let next = |state, delay, status, error| Next { state, delay, status, error };
    match result {
        AttemptResult::Delivered { status } => next("delivered", None, Some(*status), None),
        AttemptResult::Gone => next("failed", None, Some(410), Some("HTTP 410 Gone: the webhook is paused".to_owned())),
        AttemptResult::Rejected { status, error } => next("failed", None, *status, Some(error.clone())),
        AttemptResult::Retryable { status, error, retry_after } => match schedule_ms.get(retry) {
            Some(delay) => {
                let delay = Duration::from_millis(*delay).mul_f64(jitter);
                let delay = retry_after.map_or(delay, |asked| asked.max(delay));
                next("pending", Some(delay), *status, Some(error.clone()))
            }
            None => next("failed", None, *status, Some(format!("{error} (retries exhausted)"))),
        },
    }
}

/// Pauses a live webhook (loaded at `version`) for `reason`, with the `detail` its owner
/// sees on GET.
pub(super) fn pause(
    webhook_id: &str,
    space_id: &str,
    version: i64,
    (reason, detail): (&str, &str),
    now_ms: i64,
) -> StreamAppend {
    let paused = proto::WebhookPaused {
        webhook_id: webhook_id.to_owned(),
        space_id: space_id.to_owned(),
        reason: reason.to_owned(),
        detail: detail.to_owned(),
        paused_at_ms: now_ms,
    };
    StreamAppend {
        stream_id: stream_id(webhook_id),
        expected: ExpectedVersion::Exactly(version),
        events: vec![NewEvent {
            event: LogEvent::WebhookPaused(paused),
            subject_id: None,
            occurred_at: platform::time::from_millis(now_ms),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn during_a_rotation_both_secrets_sign_and_the_captured_one_comes_first() {
        let (old, new) = (Secret::from_random([1; 32]), Secret::from_random([2; 32]));
        let now = Utc::now();
        let later = Some(now + chrono::Duration::hours(1));
        let earlier = Some(now - chrono::Duration::hours(1));
        let in_grace = vec![(1, old.clone(), None), (2, new.clone(), later)];
        let Plan::Send { secrets, .. } = plan_send(&Keys::default(), None, b"{}".to_vec(), Some(&in_grace), 1, now)
        else {
            panic!("sent")
        };
        assert_eq!(secrets, vec![old.clone(), new.clone()]);
        let Plan::Send { secrets, .. } = plan_send(&Keys::default(), None, b"{}".to_vec(), Some(&in_grace), 2, now)
        else {
            panic!("sent")
        };
        assert_eq!(secrets, vec![new.clone(), old.clone()]);
        let after_grace = vec![(1, old.clone(), None), (2, new.clone(), earlier)];
        let Plan::Send { secrets, .. } = plan_send(&Keys::default(), None, b"{}".to_vec(), Some(&after_grace), 2, now)
        else {
            panic!("sent")
        };
        assert_eq!(secrets, vec![new], "after the grace period only the captured secret signs");
    }

    #[test]
    fn a_retryable_failure_waits_its_jittered_delay_or_what_the_receiver_asked_then_fails() {
        let retryable = |retry_after| AttemptResult::Retryable {
            status: Some(503),
            error: "HTTP 503 Service Unavailable".into(),
            retry_after,
        };
        let schedule = [1_000, 60_000];
        let first = next_state(&schedule, 0, &retryable(None), 0.8);
        assert_eq!((first.state, first.delay), ("pending", Some(Duration::from_millis(800))));
        let asked = next_state(&schedule, 1, &retryable(Some(Duration::from_secs(120))), 1.0);
        assert_eq!(asked.delay, Some(Duration::from_secs(120)), "the receiver asked for longer");
        let exhausted = next_state(&schedule, 2, &retryable(None), 1.0);
        assert_eq!(exhausted.state, "failed");
        assert_eq!(exhausted.error.as_deref(), Some("HTTP 503 Service Unavailable (retries exhausted)"));
        let gone = next_state(&schedule, 0, &AttemptResult::Gone, 1.0);
        assert_eq!((gone.state, gone.status, gone.delay), ("failed", Some(410), None));
        let delivered = next_state(&schedule, 0, &AttemptResult::Delivered { status: 204 }, 1.0);
        assert_eq!(delivered, Next { state: "delivered", delay: None, status: Some(204), error: None });
    }

    #[test]
    fn a_pause_is_appended_at_the_loaded_version() {
        let stream = pause("wh_1", "spc_1", 4, ("gone", "the receiver answered 410 Gone"), 1_000);
        assert_eq!(stream.stream_id, stream_id("wh_1"));
        assert!(matches!(stream.expected, ExpectedVersion::Exactly(4)));
        let [NewEvent { event: LogEvent::WebhookPaused(paused), .. }] = stream.events.as_slice() else {
            panic!("one pause")
        };
        assert_eq!((paused.reason.as_str(), paused.paused_at_ms), ("gone", 1_000));
    }

    #[test]
    fn an_erased_subject_drops_the_delivery() {
        let secrets = vec![(1, Secret::from_random([1; 32]), None)];
        assert!(matches!(
            plan_send(&Keys::default(), Some("con_1"), b"sealed".to_vec(), Some(&secrets), 1, Utc::now()),
            Plan::Drop("the data subject was erased")
        ));
    }
}
