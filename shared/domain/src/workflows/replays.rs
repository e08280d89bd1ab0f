//! A replay: a dry run of a workflow's revision against a window of its space's log
//! (`POST /workflows/{id}/replays`, and `apply --dry-run --replay`): the window it covers,
//! its stream, and the document the API shows for it.

use kernel::proto::{WorkflowReplayFinished, WorkflowReplayRequested};
use serde_json::{Value, json};

/// The longest window a replay covers: a year and a day.
pub const REPLAY_WINDOW_MAX_MS: i64 = 366 * 86_400_000;
/// The window a replay request that names none covers.
pub const REPLAY_WINDOW_DEFAULT: &str = "30d";

/// The window `text` names (`30d`, `12h`, `90m`, `1w`, `45s`: a whole number from 1, without
/// a leading zero and of at most nine digits, then one unit), in milliseconds; a window longer
/// than [`REPLAY_WINDOW_MAX_MS`] covers that much (the log a replay reads is at most a year and
/// a day back).
pub fn parse_replay_window(text: &str) -> Result<i64, String> {
    let refused = || {
        format!("{text:?} is not a duration such as 30d, 12h, 90m or 1w (a whole number from 1, then s, m, h, d or w)")
    };
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() || number.len() > 9 || number.starts_with('0') {
        return Err(refused());
    }
    let unit_ms: i64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 7 * 86_400_000,
        _ => return Err(refused()),
    };
    let number: i64 = number.parse().map_err(|_| refused())?;
    Ok(number.saturating_mul(unit_ms).min(REPLAY_WINDOW_MAX_MS))
}

/// The stream of replay `replay_id`: its request, then its report.
pub fn replay_stream_id(replay_id: &str) -> String {
    format!("workflow-replay-{replay_id}")
}

/// A replay as the API shows it: `running` until its report (or its failure) is on the log.
pub fn replay_document(requested: &WorkflowReplayRequested, finished: Option<&WorkflowReplayFinished>) -> Value {
    let (status, report, error, finished_at) = match finished {
        None => ("running", Value::Null, Value::Null, Value::Null),
        Some(finished) if !finished.error.is_empty() => (
            "failed",
            Value::Null,
            json!({"message": finished.error}),
            json!(kernel::time::format_millis(finished.at_ms)),
        ),
        Some(finished) => (
            "completed",
            serde_json::from_str(&finished.report_json).unwrap_or(Value::Null),
            Value::Null,
            json!(kernel::time::format_millis(finished.at_ms)),
        ),
    };
    json!({
        "id": requested.replay_id,
        "workflowId": requested.workflow_id,
        "revision": requested.revision,
        "from": kernel::time::format_millis(requested.from_ms),
        "to": kernel::time::format_millis(requested.to_ms),
        "status": status,
        "finishedAt": finished_at,
        "report": report,
        "error": error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_a_whole_number_and_a_unit_capped_at_a_year_and_a_day() {
        assert_eq!(parse_replay_window("30d"), Ok(30 * 86_400_000));
        assert_eq!(parse_replay_window("1s"), Ok(1_000));
        assert_eq!(parse_replay_window("90m"), Ok(90 * 60_000));
        assert_eq!(parse_replay_window("2w"), Ok(14 * 86_400_000));
        assert_eq!(parse_replay_window("366d"), Ok(REPLAY_WINDOW_MAX_MS));
        assert_eq!(parse_replay_window("400d"), Ok(REPLAY_WINDOW_MAX_MS));
        assert_eq!(parse_replay_window("999999999w"), Ok(REPLAY_WINDOW_MAX_MS));
        for refused in ["0s", "030d", "1000000000s", "999ms", "soon", "", "-1d", "30 d", " 30d", "30D", "1.5d", "d"] {
            assert!(parse_replay_window(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn a_replay_is_running_until_its_report_or_failure() {
        let requested = WorkflowReplayRequested {
            replay_id: "wrp_1".into(),
            workflow_id: "wf_1".into(),
            space_id: "sp_1".into(),
            revision: 2,
            from_ms: 0,
            to_ms: 86_400_000,
        };
        let running = replay_document(&requested, None);
        assert_eq!((running["status"].as_str(), &running["report"]), (Some("running"), &Value::Null));
        let mut finished = WorkflowReplayFinished {
            replay_id: "wrp_1".into(),
            space_id: "sp_1".into(),
            report_json: r#"{"entered":3}"#.into(),
            error: String::new(),
            elapsed_ms: 5,
            at_ms: 86_400_100,
        };
        let done = replay_document(&requested, Some(&finished));
        assert_eq!((done["status"].as_str(), &done["report"]["entered"]), (Some("completed"), &json!(3)));
        assert_eq!(done["to"], "1970-01-02T00:00:00.000Z");
        finished.error = "the log could not be read".into();
        let failed = replay_document(&requested, Some(&finished));
        assert_eq!((failed["status"].as_str(), &failed["report"]), (Some("failed"), &Value::Null));
        assert_eq!(failed["error"]["message"], "the log could not be read");
    }
}
