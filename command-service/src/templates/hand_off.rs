//! Handing an appended email to the relay inline, and recording the outcome.

use std::time::Duration;

use actix_web::http::StatusCode;
use mail::outbox::{self, Handed, Prepared, Unhanded};
use platform::error::{ApiError, Code};
use platform::events::LogEvent;
use serde_json::Value;

use crate::State;
use crate::pipeline::{Answer, Then};

/// The send's answer waits for the hand-off: 200 with its outcome, or 503
/// `idempotency_outcome_unknown` (unconfirmed) when the outcome is unknown. The hand-off
/// records the idempotent completion (the outbox row holds the claim). `unhanded`: the lease
/// the send's append took ([`outbox::claimed_guard`]).
pub fn now(prepared: Prepared, unhanded: Unhanded) -> Then {
    Then::Finish(Box::new(move |state| {
        Box::pin(async move {
            match hand_off(&state, &prepared, Some(unhanded)).await {
                Some((body, recorded)) => Ok((Answer::json(StatusCode::OK, body), recorded)),
                // Stored, but the relay may or may not have the message: never "retry".
                None => Err(ApiError::of(
                    Code::OutcomeUnknown,
                    "the email was stored but its hand-off's outcome is unknown; it is never sent again blindly: \
                     reconcile before a new send",
                )
                .unconfirmed()),
            }
        })
    }))
}

/// The hand-off runs after the answer; the outbox worker is its backstop.
pub fn later(prepared: Prepared) -> Then {
    Then::Detach(Box::new(move |state| {
        Box::pin(async move {
            hand_off(&state, &prepared, None).await;
        })
    }))
}

/// Hands an appended email to the relay inline and records the outcome; the answer to give,
/// or `None` when the outcome is unknown (another hand-off has it, or the exchange broke off
/// after the message was sent). `unhanded`: the lease the append took with the row; without
/// one, the row is claimed first. The outbox worker finishes what this leaves.
pub async fn hand_off(
    state: &State,
    prepared: &Prepared,
    unhanded: Option<Unhanded>,
) -> Option<(Value, platform::log::Appended)> {
    if state.settings.email.handoff_delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(state.settings.email.handoff_delay_ms)).await;
    }
    let email_id = &prepared.parties.email_id;
    let lease = match unhanded {
        Some(unhanded) => unhanded.start()?,
        None => match state.claims.claim(email_id, state.settings.email_lease()).await {
            Ok(Some(lease)) => lease,
            Ok(None) => return None,
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), email = %email_id, "could not claim the hand-off; the outbox worker will");
                return None;
            }
        },
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
