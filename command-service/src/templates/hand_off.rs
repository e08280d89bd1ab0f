//! Handing an appended email to the relay inline, and recording the outcome.

use std::time::Duration;

use mail::outbox::{self, Handed, Prepared};
use platform::events::LogEvent;
use serde_json::Value;

use crate::State;

/// Hands an appended email to the relay inline and records the outcome; the answer to give,
/// or `None` when the outcome is unknown (another hand-off has it, or the exchange broke off
/// after the message was sent). The outbox worker finishes what this leaves.
pub async fn hand_off(state: &State, prepared: &Prepared) -> Option<(Value, platform::log::Appended)> {
    if state.settings.email.handoff_delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(state.settings.email.handoff_delay_ms)).await;
    }
    let email_id = &prepared.parties.email_id;
    let lease = match state.claims.claim(email_id, state.settings.email_lease()).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return None,
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), email = %email_id, "could not claim the hand-off; the outbox worker will");
            return None;
        }
    };
    match outbox::hand_off(&state.pool, &state.event_log, &state.mailer, &lease, prepared, None).await {
        Handed::Recorded(event, appended) if matches!(*event, LogEvent::EmailSent(_)) => {
            Some((outbox::answer(email_id, None), appended))
        }
        Handed::Recorded(event, appended) => match *event {
            LogEvent::EmailFailed(failed) => {
                Some((outbox::answer(email_id, Some((&failed.code, &failed.message))), appended))
            }
            _ => None,
        },
        _ => None,
    }
}
