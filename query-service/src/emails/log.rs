//! The delivery log's request and rows (pure): which emails `GET /emails` lists (the space's,
//! narrowed to a contact, a broadcast run, a workflow or a step), which statuses it keeps, where a
//! page starts (a cursor: the last row's time and id, and the request it was issued for), and
//! each row as JSON, as an NDJSON line or as a CSV record.

use api::http::query_value;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use platform::error::{ApiError, Code};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Which of the space's emails are listed: each given filter narrows the list (all of them
/// hold for a row).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Scope {
    pub contact_id: Option<String>,
    pub broadcast_run_id: Option<String>,
    pub workflow_id: Option<String>,
    pub step_id: Option<String>,
}

/// The statuses the `status` filter takes: an email's status, or what its recipient did.
pub(crate) const STATUSES: [&str; 11] = [
    "scheduled",
    "held",
    "sent",
    "failed",
    "outcome_unknown",
    "bounced",
    "complained",
    "skipped",
    "opened",
    "clicked",
    "unsubscribed",
];

/// The statuses that are what a recipient did rather than an email's status.
const ENGAGED: [&str; 3] = ["opened", "clicked", "unsubscribed"];

/// A delivery log request: its scope and the statuses it keeps (none: all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub scope: Scope,
    /// Sorted, without repeats.
    pub statuses: Vec<String>,
}

impl Request {
    /// Parses `contactId`, `broadcastRunId`, `workflowId`, `stepId` and `status`.
    pub(crate) fn parse(query: &[(String, String)]) -> Result<Self, ApiError> {
        let value =
            |name: &str| query_value(query, name).map(str::trim).filter(|value| !value.is_empty()).map(str::to_owned);
        let invalid = |message: String| ApiError::of(Code::InvalidQueryParameter, message);
        let scope = Scope {
            contact_id: value("contactId"),
            broadcast_run_id: value("broadcastRunId"),
            workflow_id: value("workflowId"),
            step_id: value("stepId"),
        };
        let mut statuses = Vec::new();
        for (name, raw) in query {
            if name != "status" {
                continue;
            }
            for status in raw.split(',').map(str::trim).filter(|status| !status.is_empty()) {
                if !STATUSES.contains(&status) {
                    return Err(invalid(format!(
                        "status {:?} is not one of {}",
                        platform::storable::escaped(status),
                        STATUSES.join(", ")
                    )));
                }
                statuses.push(status.to_owned());
            }
        }
        statuses.sort();
        statuses.dedup();
        Ok(Self { scope, statuses })
    }

    /// The email statuses kept (empty: the filter names only what recipients did, or nothing).
    pub(crate) fn email_statuses(&self) -> Vec<&str> {
        self.statuses.iter().map(String::as_str).filter(|status| !ENGAGED.contains(status)).collect()
    }

    /// Whether the filter keeps what a recipient did: (opened, clicked, unsubscribed).
    pub(crate) fn engaged(&self) -> (bool, bool, bool) {
        let has = |status: &str| self.statuses.iter().any(|kept| kept == status);
        (has("opened"), has("clicked"), has("unsubscribed"))
    }

    /// Whether this is a contact's unfiltered list (whose total is kept).
    pub(crate) fn contact_only(&self) -> Option<&str> {
        let Scope { contact_id, broadcast_run_id, workflow_id, step_id } = &self.scope;
        let alone = broadcast_run_id.is_none() && workflow_id.is_none() && step_id.is_none();
        contact_id.as_deref().filter(|_| alone && self.statuses.is_empty())
    }

    /// The request as its cursors name it.
    fn fingerprint(&self) -> String {
        let Scope { contact_id, broadcast_run_id, workflow_id, step_id } = &self.scope;
        let part = |value: &Option<String>| value.clone().unwrap_or_default();
        serde_json::to_string(&[
            part(contact_id),
            part(broadcast_run_id),
            part(workflow_id),
            part(step_id),
            self.statuses.join(","),
        ])
        .unwrap_or_default()
    }
}

/// Where the next page starts, and the request and page size it was issued for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Cursor {
    /// `scheduledAt` (microseconds) and id of the last row returned.
    #[serde(rename = "a")]
    pub after_at: i64,
    #[serde(rename = "i")]
    pub after_id: String,
    #[serde(rename = "q")]
    request: String,
    #[serde(rename = "l")]
    pub limit: i64,
}

impl Cursor {
    pub(crate) fn after(request: &Request, (at, id): (DateTime<Utc>, &str), limit: i64) -> Self {
        Self { after_at: at.timestamp_micros(), after_id: id.to_owned(), request: request.fingerprint(), limit }
    }

    pub(crate) fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    /// The cursor `text`, which must have been issued for `request`.
    pub(crate) fn decode(text: &str, request: &Request) -> Result<Self, ApiError> {
        let malformed = || ApiError::of(Code::InvalidCursor, "cursor is malformed; pass nextCursor as given");
        let bytes = api::pagination::opaque_cursor_bytes(text).ok_or_else(malformed)?;
        let cursor: Self = serde_json::from_slice(&bytes).map_err(|_| malformed())?;
        if !platform::storable::is_storable(&cursor.after_id) || cursor.position().is_none() {
            return Err(malformed());
        }
        if cursor.request != request.fingerprint() {
            return Err(ApiError::of(
                Code::InvalidCursor,
                "this cursor was issued for another request; keep contactId, broadcastRunId, workflowId, stepId and \
                 status fixed while paging",
            ));
        }
        Ok(cursor)
    }

    /// The last row's time and id.
    pub(crate) fn position(&self) -> Option<(DateTime<Utc>, String)> {
        DateTime::from_timestamp_micros(self.after_at).map(|at| (at, self.after_id.clone()))
    }
}

/// A row of the log: the email's story without its timeline, with the address it was sent to
/// and, from the timeline, the gate that holds or refused it, the error that failed it and the
/// links a person clicked (their positions among the email's tracked links, ascending).
pub(crate) fn row(mut story: Value, address: Option<String>) -> Value {
    let timeline = story.as_object_mut().and_then(|story| story.remove("timeline")).unwrap_or(Value::Null);
    let status = story["status"].as_str().unwrap_or_default().to_owned();
    let last = |kind: &str| {
        timeline.as_array().and_then(|entries| entries.iter().rev().find(|entry| entry["type"] == kind)).cloned()
    };
    let (gate, error) = match status.as_str() {
        "held" => (last("held").map(|entry| entry["gate"].clone()), None),
        "skipped" => {
            last("skipped").map(|entry| (Some(entry["gate"].clone()), Some(entry["error"].clone()))).unwrap_or_default()
        }
        "failed" => (None, last("failed").map(|entry| entry["error"].clone())),
        _ => (None, None),
    };
    let mut links: Vec<u64> = timeline
        .as_array()
        .into_iter()
        .flatten()
        .filter(|entry| entry["type"] == "clicked" && entry["machine"].is_null())
        .filter_map(|entry| entry["link"].as_u64())
        .collect();
    links.sort_unstable();
    links.dedup();
    with_content_fields(&mut story);
    if let Some(object) = story.as_object_mut() {
        object.insert("address".to_owned(), address.map_or(Value::Null, Value::String));
        object.insert("gate".to_owned(), gate.unwrap_or(Value::Null));
        object.insert("error".to_owned(), error.unwrap_or(Value::Null));
        object.insert("linksClicked".to_owned(), json!(links));
    }
    story
}

/// A story stored before emails recorded their locale and parts gets them empty.
pub(crate) fn with_content_fields(story: &mut Value) {
    if let Some(object) = story.as_object_mut() {
        object.entry("locale").or_insert(Value::Null);
        object.entry("parts").or_insert_with(|| Value::Array(Vec::new()));
    }
}

/// Appends `fields` to `out` as one CSV record, as RFC 4180 and the `csv` crate's writer
/// write it: a field holding a comma, a double quote or a line break in double quotes, its
/// quotes doubled; the record ended by `\n`. (Written here rather than with the `csv` crate:
/// quoting is all an export of known columns needs, and the query service then links no CSV
/// reader; the import, which reads files, keeps the crate.)
pub(crate) fn write_csv_record<S: AsRef<str>>(out: &mut Vec<u8>, fields: impl IntoIterator<Item = S>) {
    for (index, field) in fields.into_iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        let field = field.as_ref();
        if field.contains([',', '"', '\r', '\n']) {
            out.push(b'"');
            out.extend_from_slice(field.replace('"', "\"\"").as_bytes());
            out.push(b'"');
        } else {
            out.extend_from_slice(field.as_bytes());
        }
    }
    out.push(b'\n');
}

/// The CSV header, in the order of [`csv_record`].
pub(crate) const CSV_HEADER: [&str; 28] = [
    "emailId",
    "contactId",
    "address",
    "status",
    "gate",
    "errorCode",
    "errorMessage",
    "notBefore",
    "scheduledAt",
    "sentAt",
    "templateId",
    "templateRevision",
    "locale",
    "kind",
    "origin",
    "broadcastRunId",
    "workflowId",
    "stepId",
    "variant",
    "cohort",
    "unsubscribed",
    "opens",
    "humanOpens",
    "clicks",
    "humanClicks",
    "firstOpenedAt",
    "firstClickedAt",
    "linksClicked",
];

/// A row as a CSV record. Free text that a spreadsheet would take for a formula (a relay's
/// reply starting with `=`, `+`, `-` or `@`) is prefixed with `'`.
pub(crate) fn csv_record(row: &Value) -> Vec<String> {
    let text = |value: &Value| match value {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let inert = |text: String| {
        if text.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{text}") } else { text }
    };
    let engagement = &row["engagement"];
    vec![
        text(&row["id"]),
        text(&row["contactId"]),
        text(&row["address"]),
        text(&row["status"]),
        text(&row["gate"]),
        text(&row["error"]["code"]),
        inert(text(&row["error"]["message"])),
        text(&row["notBefore"]),
        text(&row["scheduledAt"]),
        text(&row["sentAt"]),
        text(&row["templateId"]),
        text(&row["templateRevision"]),
        text(&row["locale"]["tag"]),
        text(&row["kind"]),
        text(&row["origin"]["type"]),
        text(&row["origin"]["broadcastRunId"]),
        text(&row["origin"]["workflowId"]),
        text(&row["origin"]["stepId"]),
        text(&row["origin"]["variant"]),
        text(&row["origin"]["cohort"]),
        text(&row["unsubscribed"]),
        text(&engagement["opens"]),
        text(&engagement["humanOpens"]),
        text(&engagement["clicks"]),
        text(&engagement["humanClicks"]),
        text(&engagement["firstOpenedAt"]),
        text(&engagement["firstClickedAt"]),
        row["linksClicked"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|position| position.to_string())
            .collect::<Vec<_>>()
            .join(" "),
    ]
}

/// The pagination of a page: `totalCount` only where it is kept (a contact's unfiltered list).
pub(crate) fn pagination(limit: i64, offset: i64, total: Option<i64>, next: Option<String>) -> Value {
    json!({"limit": limit, "offset": offset, "totalCount": total, "hasMore": next.is_some(), "nextCursor": next})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
    }

    #[test]
    fn given_one_scope_and_statuses_when_parsed_then_they_are_kept_sorted_once() {
        let request =
            Request::parse(&query(&[("broadcastRunId", "bcr_1"), ("status", "sent,skipped"), ("status", "sent")]))
                .expect("parses");
        assert_eq!(request.scope, Scope { broadcast_run_id: Some("bcr_1".into()), ..Scope::default() });
        assert_eq!(request.statuses, ["sent", "skipped"]);
        let step = Request::parse(&query(&[("workflowId", "wf_1"), ("stepId", "welcome"), ("status", "opened")]))
            .expect("parses");
        assert_eq!(step.scope.step_id.as_deref(), Some("welcome"));
        assert_eq!(step.contact_only(), None);
        let contact = Request::parse(&query(&[("contactId", "con_1")])).expect("parses");
        assert_eq!(contact.contact_only(), Some("con_1"), "a contact's unfiltered list keeps its total");
        let all = Request::parse(&query(&[])).expect("the space's whole log");
        assert_eq!((all.scope, all.statuses.len()), (Scope::default(), 0));
        assert_eq!((step.email_statuses(), step.engaged()), (Vec::<&str>::new(), (true, false, false)));
    }

    #[test]
    fn given_an_unknown_status_when_parsed_then_it_is_400() {
        for pairs in [vec![("status", "delivered")], vec![("contactId", "con_1"), ("status", "sent,nope")]] {
            let refused = Request::parse(&query(&pairs)).expect_err("refused");
            assert_eq!(refused.code(), Some(Code::InvalidQueryParameter), "{pairs:?}");
        }
    }

    #[test]
    fn a_cursor_pages_only_the_request_it_was_issued_for() {
        let request = Request::parse(&query(&[("broadcastRunId", "bcr_1"), ("status", "sent")])).expect("parses");
        let at = DateTime::from_timestamp_micros(1_700_000_000_000_123).expect("a time");
        let cursor = Cursor::after(&request, (at, "em_9"), 50);
        let decoded = Cursor::decode(&cursor.encode(), &request).expect("decodes");
        assert_eq!(decoded.position(), Some((at, "em_9".to_owned())));
        let other = Request::parse(&query(&[("broadcastRunId", "bcr_1")])).expect("parses");
        assert_eq!(
            Cursor::decode(&cursor.encode(), &other).expect_err("another request").code(),
            Some(Code::InvalidCursor)
        );
        assert_eq!(Cursor::decode("not a cursor", &request).expect_err("malformed").code(), Some(Code::InvalidCursor));
    }

    #[test]
    fn a_row_names_the_gate_and_the_error_and_a_csv_record_keeps_formulas_inert() {
        let skipped = json!({"id": "em_1", "status": "skipped", "engagement": {}, "origin": {"type": "broadcast"},
            "timeline": [{"type": "skipped", "gate": "suppressed",
                          "error": {"code": "recipient_suppressed", "message": "=HYPERLINK(\"x\")"}}]});
        let row = row(skipped, None);
        assert!(row.get("timeline").is_none());
        assert_eq!(
            (&row["gate"], &row["error"]["code"], &row["address"]),
            (&json!("suppressed"), &json!("recipient_suppressed"), &Value::Null)
        );
        let record = csv_record(&row);
        assert_eq!(record.len(), CSV_HEADER.len());
        assert_eq!(record[6], "'=HYPERLINK(\"x\")");
        let held = json!({"id": "em_2", "status": "held", "notBefore": "2026-11-28T07:00:00.000Z",
            "timeline": [{"type": "scheduled"}, {"type": "held", "gate": "quiet_hours"}]});
        let row = super::row(held, Some("ada@example.com".into()));
        assert_eq!(
            (&row["gate"], &row["error"], &row["address"]),
            (&json!("quiet_hours"), &Value::Null, &json!("ada@example.com"))
        );
        assert_eq!(csv_record(&row)[7], "2026-11-28T07:00:00.000Z");
    }

    #[test]
    fn a_row_lists_the_links_a_person_clicked_once_each_and_not_a_machines() {
        let story = json!({"id": "em_1", "status": "sent", "engagement": {}, "origin": {"type": "broadcast"},
            "timeline": [{"type": "clicked", "link": 3, "machine": "right_after_delivery"},
                         {"type": "clicked", "link": 2, "machine": null},
                         {"type": "clicked", "link": null, "machine": null},
                         {"type": "clicked", "link": 1, "machine": null},
                         {"type": "clicked", "link": 2, "machine": null}]});
        let row = row(story, None);
        assert_eq!(row["linksClicked"], json!([1, 2]));
        assert_eq!(csv_record(&row).last().map(String::as_str), Some("1 2"));
    }

    #[test]
    fn a_csv_record_reads_back_field_for_field_with_the_csv_crates_reader() {
        let fields = ["plain", "", "a,b", "say \"hi\"", "two\nlines", "cr\rlf", "'=1+1", "é ünïcode"];
        let mut out = Vec::new();
        write_csv_record(&mut out, fields);
        write_csv_record(&mut out, fields.map(|field| field.len().to_string()));
        assert_eq!(
            String::from_utf8_lossy(&out).lines().next(),
            Some("plain,,\"a,b\",\"say \"\"hi\"\"\",\"two"),
            "a field is quoted only when it must be"
        );
        let mut reader = csv::ReaderBuilder::new().has_headers(false).from_reader(out.as_slice());
        let records: Vec<csv::StringRecord> = reader.records().collect::<Result<_, _>>().expect("records");
        assert_eq!(records.len(), 2, "a line break inside a quoted field does not end the record");
        assert_eq!(records[0].iter().collect::<Vec<_>>(), fields);
        assert_eq!(records[1].iter().collect::<Vec<_>>(), ["5", "0", "3", "8", "9", "5", "5", "12"]);
    }
}
