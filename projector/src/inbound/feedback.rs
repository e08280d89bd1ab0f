//! What mail coming back to a return path says about an email: a delivery status
//! notification (RFC 3464, `multipart/report; report-type=delivery-status`) that it bounced,
//! or an abuse feedback report (ARF, RFC 5965, `report-type=feedback-report`) that its
//! recipient complained. Pure: bytes in, a [`Report`] out; MIME is parsed by `mail-parser`,
//! and the report's field blocks (header-like) by its header parser.
//!
//! The email is named by the envelope recipient (`bounce+<emailId>@<return path>`, the return
//! path every message is sent with), or, for mail sent to another address of the return path
//! (a feedback loop's), by the Message-ID of the original message the report quotes
//! (`<emailId@<domain>>`). Whether that email exists, and in which space, the caller checks.

use mail::enhanced_status;
use mail_parser::{Message, MessageParser, MimeHeaders, PartType};

/// The local part prefix of the return path: `bounce+<emailId>@<return path>`.
pub(crate) const BOUNCE_PREFIX: &str = "bounce+";

/// What a message received at a return path reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The email did not reach its recipient.
    Bounce { email_id: String, hard: bool, status: String, diagnostic: String },
    /// Its recipient reported it as unwanted.
    Complaint { email_id: String, feedback_type: String, reporter: String },
    /// Nothing to record, and why (`not_a_report`, `no_email_id`, `not_a_failure`, ...).
    Ignored(&'static str),
}

/// The email id of a return-path recipient `bounce+<emailId>@...`, when it is one.
pub(crate) fn email_of_recipient(recipient: &str) -> Option<&str> {
    let (local, _) = recipient.rsplit_once('@')?;
    let id = local.strip_prefix(BOUNCE_PREFIX)?;
    is_email_id(id).then_some(id)
}

/// Whether `id` has the shape of an email id (`em_` and a ULID-like body).
pub(crate) fn is_email_id(id: &str) -> bool {
    id.strip_prefix("em_")
        .is_some_and(|body| (20..=40).contains(&body.len()) && body.bytes().all(|byte| byte.is_ascii_alphanumeric()))
}

/// Reads a message received for `recipient`.
pub fn parse(raw: &[u8], recipient: &str) -> Report {
    let Some(message) = MessageParser::default().parse(raw) else { return Report::Ignored("not_a_message") };
    let report_type = message
        .content_type()
        .filter(|content| content.ctype().eq_ignore_ascii_case("multipart"))
        .filter(|content| content.subtype().is_some_and(|subtype| subtype.eq_ignore_ascii_case("report")))
        .and_then(|content| content.attribute("report-type"))
        .map(str::to_ascii_lowercase);
    let email_id = email_of_recipient(recipient).map(str::to_owned).or_else(|| quoted_email_id(&message));
    match report_type.as_deref() {
        Some("delivery-status") => {
            let Some(fields) = part_of(&message, &["delivery-status", "global-delivery-status"]) else {
                return Report::Ignored("no_delivery_status");
            };
            let Some(email_id) = email_id else { return Report::Ignored("no_email_id") };
            bounce(email_id, &fields)
        }
        Some("feedback-report") => {
            let Some(fields) = part_of(&message, &["feedback-report"]) else {
                return Report::Ignored("no_feedback_report");
            };
            let Some(email_id) = email_id else { return Report::Ignored("no_email_id") };
            complaint(email_id, &fields)
        }
        _ => Report::Ignored("not_a_report"),
    }
}

/// The field blocks of the `message/<subtype>` part: the per-message block first, then one
/// per recipient. Each block is a list of (lowercased name, unfolded value).
type Blocks = Vec<Vec<(String, String)>>;

fn part_of(message: &Message<'_>, subtypes: &[&str]) -> Option<Blocks> {
    let part = message.parts.iter().find(|part| {
        part.content_type().is_some_and(|content| {
            content.ctype().eq_ignore_ascii_case("message")
                && content.subtype().is_some_and(|subtype| subtypes.iter().any(|s| subtype.eq_ignore_ascii_case(s)))
        })
    })?;
    let body = match &part.body {
        // A `message/*` subtype the parser does not treat as a message is kept as bytes; one
        // it parses as a nested message (`global-*` in some versions) is its raw bytes.
        PartType::Message(nested) => nested.raw_message().to_vec(),
        _ => part.contents().to_vec(),
    };
    Some(blocks(&body))
}

/// Splits a report body into its field blocks (separated by blank lines) and parses each.
fn blocks(body: &[u8]) -> Blocks {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut fields: Vec<(String, String)> = Vec::new();
            for line in block.lines() {
                if line.starts_with([' ', '\t']) {
                    if let Some((_, value)) = fields.last_mut() {
                        value.push(' ');
                        value.push_str(line.trim());
                    }
                } else if let Some((name, value)) = line.split_once(':') {
                    fields.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
                }
            }
            fields
        })
        .filter(|fields| !fields.is_empty())
        .collect()
}

fn field<'a>(block: &'a [(String, String)], name: &str) -> Option<&'a str> {
    block.iter().find(|(field, _)| field == name).map(|(_, value)| value.as_str())
}

/// The first recipient block that failed (or, failing that, was delayed) decides.
fn bounce(email_id: String, blocks: &Blocks) -> Report {
    let recipients =
        blocks.iter().filter(|block| field(block, "final-recipient").is_some() || field(block, "action").is_some());
    let mut delayed = None;
    for block in recipients {
        let action = field(block, "action").unwrap_or_default().to_ascii_lowercase();
        let status = field(block, "status").and_then(enhanced_status).unwrap_or_default();
        let diagnostic = field(block, "diagnostic-code")
            .map(|code| code.split_once(';').map_or(code, |(_, text)| text).trim().to_owned())
            .unwrap_or_default();
        match action.as_str() {
            "failed" => {
                // A permanent failure is `5.x.x`; a failed action with a transient status
                // (`4.x.x`, for example a full mailbox reported by a later hop) is soft.
                let hard = !status.starts_with('4');
                return Report::Bounce { email_id, hard, status, diagnostic: limit(diagnostic) };
            }
            "delayed" if delayed.is_none() => delayed = Some((status, diagnostic)),
            _ => {}
        }
    }
    match delayed {
        Some((status, diagnostic)) => Report::Bounce { email_id, hard: false, status, diagnostic: limit(diagnostic) },
        None => Report::Ignored("not_a_failure"),
    }
}

fn complaint(email_id: String, blocks: &Blocks) -> Report {
    let Some(first) = blocks.first() else { return Report::Ignored("no_feedback_report") };
    let Some(feedback_type) = field(first, "feedback-type") else { return Report::Ignored("no_feedback_type") };
    let feedback_type = feedback_type.to_ascii_lowercase();
    // RFC 5965 types; `not-spam` says the opposite of a complaint.
    if !matches!(feedback_type.as_str(), "abuse" | "fraud" | "virus" | "other") {
        return Report::Ignored("not_a_complaint");
    }
    let reporter = limit(field(first, "user-agent").unwrap_or_default().to_owned());
    Report::Complaint { email_id, feedback_type, reporter }
}

/// The email id in the Message-ID of the original message a report quotes (as
/// `message/rfc822`, `text/rfc822-headers` or `message/rfc822-headers`).
fn quoted_email_id(message: &Message<'_>) -> Option<String> {
    message.parts.iter().skip(1).find_map(|part| {
        let quoted_id = match &part.body {
            PartType::Message(nested) => nested.message_id().map(str::to_owned),
            _ => {
                let is_headers = part.content_type().is_some_and(|content| {
                    content.subtype().is_some_and(|subtype| subtype.eq_ignore_ascii_case("rfc822-headers"))
                });
                if !is_headers {
                    return None;
                }
                let contents = part.contents();
                MessageParser::default()
                    .parse_headers(contents)
                    .and_then(|headers| headers.message_id().map(str::to_owned))
            }
        }?;
        let (local, _) = quoted_id.trim_matches(['<', '>']).split_once('@')?;
        is_email_id(local).then(|| local.to_owned())
    })
}

/// Diagnostics and reporters are kept to 500 characters.
fn limit(mut text: String) -> String {
    if let Some((index, _)) = text.char_indices().nth(500) {
        text.truncate(index);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "em_01JH3K5M7N9P1Q3R5S7T9V1W3X";

    fn dsn(action: &str, status: &str) -> String {
        format!(
            "From: MAILER-DAEMON@mx.example.net\r\nTo: bounce+{ID}@bounces.acme.test\r\nSubject: Undelivered Mail\r\n\
             MIME-Version: 1.0\r\nContent-Type: multipart/report; report-type=delivery-status;\r\n boundary=\"b1\"\r\n\r\n\
             --b1\r\nContent-Type: text/plain\r\n\r\nYour message could not be delivered.\r\n\
             --b1\r\nContent-Type: message/delivery-status\r\n\r\n\
             Reporting-MTA: dns; mx.example.net\r\nArrival-Date: Tue, 24 Nov 2026 10:00:00 +0000\r\n\r\n\
             Final-Recipient: rfc822; ada@example.net\r\nAction: {action}\r\nStatus: {status}\r\n\
             Diagnostic-Code: smtp; 550 5.1.1 <ada@example.net>: Recipient address\r\n rejected: User unknown\r\n\r\n\
             --b1\r\nContent-Type: text/rfc822-headers\r\n\r\n\
             From: Acme <news@acme.test>\r\nMessage-ID: <{ID}@acme.test>\r\nSubject: Hello\r\n\r\n--b1--\r\n"
        )
    }

    #[test]
    fn a_failed_action_with_a_permanent_status_is_a_hard_bounce() {
        let report = parse(dsn("failed", "5.1.1").as_bytes(), &format!("bounce+{ID}@bounces.acme.test"));
        assert_eq!(
            report,
            Report::Bounce {
                email_id: ID.to_owned(),
                hard: true,
                status: "5.1.1".to_owned(),
                diagnostic: "550 5.1.1 <ada@example.net>: Recipient address rejected: User unknown".to_owned(),
            }
        );
    }

    #[test]
    fn transient_failures_and_delays_are_soft_and_deliveries_are_nothing() {
        let recipient = format!("bounce+{ID}@bounces.acme.test");
        assert!(matches!(parse(dsn("failed", "4.2.2").as_bytes(), &recipient), Report::Bounce { hard: false, .. }));
        assert!(matches!(parse(dsn("delayed", "4.4.1").as_bytes(), &recipient), Report::Bounce { hard: false, .. }));
        assert_eq!(parse(dsn("delivered", "2.0.0").as_bytes(), &recipient), Report::Ignored("not_a_failure"));
    }

    #[test]
    fn the_quoted_message_id_names_the_email_when_the_recipient_does_not() {
        let report = parse(dsn("failed", "5.1.1").as_bytes(), "postmaster@bounces.acme.test");
        assert!(matches!(report, Report::Bounce { email_id, .. } if email_id == ID));
    }

    #[test]
    fn an_arf_report_is_a_complaint() {
        let arf = format!(
            "From: fbl@isp.example\r\nTo: feedback@bounces.acme.test\r\nMIME-Version: 1.0\r\n\
             Content-Type: multipart/report; report-type=feedback-report; boundary=\"f\"\r\n\r\n\
             --f\r\nContent-Type: text/plain\r\n\r\nThis is an abuse report.\r\n\
             --f\r\nContent-Type: message/feedback-report\r\n\r\n\
             Feedback-Type: Abuse\r\nUser-Agent: ISP-FBL/1.0\r\nVersion: 1\r\n\r\n\
             --f\r\nContent-Type: message/rfc822\r\n\r\n\
             From: news@acme.test\r\nMessage-ID: <{ID}@acme.test>\r\nSubject: Hi\r\n\r\nBody\r\n--f--\r\n"
        );
        let report = parse(arf.as_bytes(), "feedback@bounces.acme.test");
        assert_eq!(
            report,
            Report::Complaint {
                email_id: ID.to_owned(),
                feedback_type: "abuse".to_owned(),
                reporter: "ISP-FBL/1.0".to_owned()
            }
        );
        let not_spam = arf.replace("Feedback-Type: Abuse", "Feedback-Type: not-spam");
        assert_eq!(parse(not_spam.as_bytes(), "feedback@bounces.acme.test"), Report::Ignored("not_a_complaint"));
    }

    #[test]
    fn plain_mail_and_garbage_are_ignored() {
        let recipient = format!("bounce+{ID}@bounces.acme.test");
        assert_eq!(parse(b"Subject: out of office\r\n\r\nI am away.\r\n", &recipient), Report::Ignored("not_a_report"));
        assert_eq!(parse(b"", &recipient), Report::Ignored("not_a_message"));
        let torn = dsn("failed", "5.1.1");
        for cut in (0..torn.len()).step_by(7) {
            let _ = parse(&torn.as_bytes()[..cut], &recipient);
        }
    }

    #[test]
    fn return_path_recipients_name_emails() {
        assert_eq!(email_of_recipient(&format!("bounce+{ID}@b.acme.test")), Some(ID));
        assert_eq!(email_of_recipient("bounce+em_x@b.acme.test"), None);
        assert_eq!(email_of_recipient("ada@b.acme.test"), None);
    }
}
