//! A business event's stream (`event/<id>`): its acceptance, then its readiness changes.

/// The log stream of business event `event_id`.
pub fn stream_id(event_id: &str) -> String {
    format!("event/{event_id}")
}
