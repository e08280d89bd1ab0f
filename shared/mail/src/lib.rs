//! Mail as it leaves: rendering templates, the unsubscribe footer, the send gate and the
//! hand-off, building and DKIM-signing messages, the SMTP relay and the outbox. Used by the
//! command service (the inline hand-off of a send, authoring) and the projector (the outbox
//! worker); the query service does not link it.
//!
//! # Email
//!
//! Domains, senders, topics, templates, partials, layouts, forms and the space's allowance are
//! authored in the workspace file (`command-service/src/authoring/email.rs`: checked,
//! references resolved to ids; `content.rs`: locales, partials and layouts, and every
//! template variant rendered with sample data of its schemas) and held by the catalog read model as typed definitions
//! (`domain::email::resources`). A domain's DKIM key (RSA 2048, generated at the first apply
//! or given) is kept only encrypted: a data key of its own, wrapped by the master key, beside
//! the ciphertext in the definition; a later apply keeps it while selector and key stay.
//!
//! **A send** (`POST /templates/{id}/send`, `command-service/src/templates/`):
//!
//! 1. The template with its sender, domain and the space's allowance, and each context
//!    record's schema, come from what the process keeps per catalog revision
//!    (`domain::catalog::Kept`, `WriteContexts`) or from one catalog statement each; as for a
//!    record create, the append then carries the revision guard, and a catalog that moved on
//!    drops the kept entries and the send is decided again on a fresh read. The context
//!    records are loaded as an upsert loads them (`records::load::load_upsert`) and upserted
//!    by identity precedence in the send's decision with the record write path's own
//!    (`records::decide::decide_upsert`), decided together but not yet appended. The
//!    recipient's send facts (`facts.rs`) are read for the contact its identities matched
//!    and for each address it may have; the decision picks those of the contact it decided.
//! 2. The recipient (the template's `recipient` key) is checked: suppressions of the space and
//!    global ones for every template; the email consent attributes and, for a topic, a
//!    `subscribed` topic status for marketing (422s, nothing written, D9).
//! 3. The template is rendered with Liquid (HTML part against HTML-escaped values) by
//!    `send::render_email`, the one way in for every send (template, form, broadcast,
//!    workflow; `render::render` is private to `mail`, and `render::render_sample`, which adds
//!    no footer, serves only `apply`'s checks): it picks the variant of the
//!    recipient's locale (`domain::email::locale::pick`: exact tag, language, default), renders
//!    its partials (`{% render %}`, isolated scope) and its layout (`{{ content }}`) in that
//!    locale, each parsed once per revision and locale (`render.rs` keeps parsers by the
//!    partials' ids, revisions and tag), and says the language (`lang`, `dir`). The template's
//!    partials and layout come with it from the catalog in the same statement. For marketing it
//!    sets `unsubscribeUrl`, `postalAddress` and `subscribedTo` and adds the visible
//!    unsubscribe footer (`email/footer.rs`, pure) to each part that does not show that link. Then, as the template's tracking says, the HTML
//!    part's links become signed tracking links and the open pixel closes its body (see
//!    Engagement). Both are part of the sealed content, so a rebuild sends the same message and
//!    the DKIM body hash covers them.
//! 4. One append holds the context records, `EmailScheduled` (stream `email-<id>`; the rendered
//!    content and address sealed under the contact's key), the outbox row (`email_outbox`,
//!    with the send's idempotency claim, already claimed for this process's inline hand-off:
//!    `attempting` under a lease, so nothing is written between the append and the relay)
//!    and the allowance guard (`email_allowance_usage`, per
//!    space and UTC month; refused: 402). An acknowledged send is durable before any SMTP.
//! 5. The inline hand-off, under the lease its append took (a form's confirmation, handed off
//!    after the answer, claims its `pending` row first: `pending` → `attempting`, committed
//!    before the relay is contacted), builds the MIME message (multipart text and HTML, Message-ID
//!    `<emailId@domain>`, Date from the scheduling, envelope sender `bounce+<emailId>@<return
//!    path>`, List-Unsubscribe and List-Unsubscribe-Post for marketing), signs it with DKIM
//!    (relaxed/relaxed, over From, To, Subject, Date, Message-ID and the two List headers) and
//!    hands it to the relay (`email/relay.rs`, below; TLS and AUTH from the relay URL),
//!    or writes it as an `.eml` file when no relay is configured (headed by `Return-Path:
//!    <envelope sender>`, as final delivery writes it; never in what goes to a relay). The
//!    outcome is recorded in one append under the lease: `EmailSent`, or `EmailFailed` (a
//!    refusal, or the relay unreachable), the row's state and the idempotency answer.
//! 6. The answer is 200 `{emailId, status, error}`. An exchange that broke off after the
//!    message's content started (a timeout, a reset) records `EmailOutcomeUnknown` and answers 503
//!    `idempotency_outcome_unknown`: the relay may have the message, so it is never sent again.
//!
//! **A preview and a test send** (`templates/preview.rs`, `templates/test_send.rs`) render
//! through the same function without tracking. A preview appends nothing. A test send appends
//! `EmailTestRequested`, hands its message (marked `X-Test-Send`) to the relay inline and
//! appends `EmailTestSent`; no projection reads either, so nothing counts it, and the query
//! service folds its story from the stream.
//!
//! **The outbox worker** (`projector/src/workers/email/outbox.rs`, any number of processes)
//! finishes what the inline path left. A row still `pending` after `HANDOFF_GRACE_MS` (a
//! form's confirmation whose process died between the append and the hand-off, or a send
//! whose process gave back the claim its append took without handing it off) is claimed, rebuilt from the log (the
//! content opened with the contact's key; erased: `EmailFailed{recipient_erased}`) and handed
//! off, with retries on `RETRY_SCHEDULE_MS` while the relay refuses for now (4xx) or cannot be
//! reached, then `EmailFailed`. A row `attempting` whose lease ran out is a hand-off that died
//! midway: `EmailOutcomeUnknown`, never resent. So across kill -9 of any process an accepted
//! send leaves at most once, and exactly once unless a process dies during its SMTP exchange
//! or, for a template send (whose append holds its claim), between its append and the relay.
//! The idempotency claim of the send is completed by whichever hand-off records the outcome.
//!
//! Relay replies are recorded without the recipient's address (replaced by `<recipient>`).
//!
//! **The cost of a message** (what the benchmark's phase line measures, `email_handoff_phase_seconds`):
//! its scheduling append (batched with others by the log's batcher), its claim (a template
//! send's is in that append; elsewhere a committed `UPDATE`, and the claims that concurrent
//! hand-offs of a process ask for are made together in one statement, `outbox::Claims`, each
//! still only when its own hand-off starts), building and
//! signing (lettre formats the MIME message; the DKIM signature, relaxed/relaxed rsa-sha256, is
//! made by `email/dkim_sign.rs` with ring, 0.6 ms of CPU for RSA 2048), the SMTP exchange on a
//! pooled session, and the outcome's append (batched).
//!
//! **The relay client** (`shared/mail/src/relay.rs`) keeps up to `POOL_SIZE` sessions per
//! process open and reuses them without a NOOP check; where the relay offers PIPELINING
//! (RFC 2920) MAIL, RCPT and DATA go in one write, so a message on a warm session is two round
//! trips (envelope, content) where lettre's pool took five. It is built on lettre's connection
//! (TLS, EHLO, AUTH, reply parsing, dot-stuffing). Every phase is bounded by `TIMEOUT_MS`
//! (the envelope once; connecting with TLS and AUTH, and the content with the reply the relay
//! does its work before, three times it), so a hand-off ends inside its lease (nine times it
//! and 30 s). Where a failure happens decides what it means: before
//! the content is sent the relay cannot have the message, so a broken or silent session is
//! "unreachable" (retried), and a session the relay closed while pooled is replaced once on the
//! spot; a refusal during connection setup (a greeting or AUTH refused) is the relay's, never a
//! bounce of the recipient; after the content started, a broken exchange is unknown. A hand-off
//! mostly waits, so a broadcast keeps `HANDOFFS` of them in flight; the price is that a kill -9
//! of its process leaves up to that many `EmailOutcomeUnknown` (each may or may not have left,
//! and none is sent again). In a batch, the appends' guards (the outbox row, the recipient's
//! move to `scheduled`, the allowance count, an outcome's row state) run set-wise, one
//! statement for the batch; the allowance row of a space is updated once per batch.
//!
//! **TLS to the relay** follows the relay URL: `smtp://…?tls=required` (STARTTLS, required) or
//! `smtps://` (TLS from the first byte); `tls=opportunistic` is refused at start, since it
//! would send in clear text to a relay that offers no STARTTLS. The relay's certificate is
//! always verified (rustls, the public roots plus the certificates of
//! `APP__EMAIL__RELAY_CA_FILE`); one that does not verify, or a relay without STARTTLS when the
//! URL requires it, is `relay_unavailable` before any message data leaves.
//!
//! **One-click unsubscribe** (`POST /emails/{id}/unsubscribe`, public): the email's stream
//! names its contact and topic. With a topic, `SubscriptionChanged{unsubscribed}` on the
//! contact's `subscriptions-<contactId>` stream; without, the contact's email consent
//! attributes set to false (an ordinary record update). `EmailUnsubscribed` is appended once;
//! later POSTs answer the same. `GET` on the same URL (the query service) is the preference
//! page: the email's stream names the space and contact, the catalog the space's topics, the
//! contact's `subscriptions-` stream their status; its first button POSTs the one-click body to
//! the same URL, the others post choices to `POST /emails/{id}/preferences`
//! (`command-service/src/emails/preferences.rs`: `SubscriptionChanged` with source
//! `preferences` per topic that changes, and the consent granted or withdrawn as a record
//! update). The GET changes nothing. A browser (`Accept` names `text/html`, or a urlencoded post)
//! gets a page for every answer and an API client JSON (`api::pages::answer`).
//!
//! **Forms** (`command-service/src/forms/`, public): the limiters are fixed windows in
//! `rate_windows` (per client address, per form; confirmation emails per recipient digest and
//! per form). The client address is the peer's, or `X-Forwarded-For`'s rightmost untrusted hop
//! when the peer is in `APP__HTTP__TRUSTED_PROXIES`. A submission upserts the contact and, in
//! the same append, its subscription changes (`pending` with double opt-in, else `subscribed`
//! with consent granted), `FormSubmitted` (stream `form-submission-<id>`), the token's row
//! (`form_tokens`: a keyed digest of 32 random bytes, the form, the submission, the expiry) and
//! the confirmation email (`EmailScheduled`, handed off after the answer; the outbox worker is
//! the backstop). Following the link (a GET to the command service: nginx sends
//! `/v1/forms/<id>/confirm/` there; `GET /forms` and `GET /forms/{id}`, which list the forms with
//! their ids and public URLs, are the query service's) sets `confirmed_at` once, with `SubmissionConfirmed`, the subscriptions and the
//! consent; a second GET is a success.
//!
//! **Domain verification** (`projector/src/workers/email/domains.rs`, worker `domain_checks`,
//! run only when `APP__EMAIL__DNS_NAMESERVER` is set) looks up each domain's records with
//! hickory-resolver against that nameserver alone, one process at a time (an advisory lock),
//! and keeps what it found in `domain_checks`; `GET /domains` compares it with what should be
//! published.
//!
//! **Bounces and complaints** come back over SMTP to the return-path listener
//! (`projector/src/inbound/`: `projector inbound`, its own process, any number of them behind
//! the return-path domains' MX; single-node mode runs one when `APP__INBOUND__PORT` is set).
//! `smtp-proto` parses the commands; the listener does the I/O.
//!
//! - It accepts recipients only at the return path of some authored domain (550 otherwise: no
//!   relay), bounds a message at `MAX_MESSAGE_BYTES` (552, the rest read and dropped) and a
//!   silent session at `IDLE_TIMEOUT_SECONDS`.
//! - `projector::inbound::feedback` (pure) reads the message with `mail-parser`: a delivery status
//!   notification (`multipart/report; report-type=delivery-status`, RFC 3464) is a bounce —
//!   `Action: failed` with a `5.x.x` status hard, a `4.x.x` failure or `delayed` soft — and an
//!   abuse feedback report (`report-type=feedback-report`, RFC 5965, type `abuse`, `fraud`,
//!   `virus` or `other`) a complaint. The email is named by the envelope recipient
//!   `bounce+<emailId>@…`, or else by the Message-ID of the quoted original.
//! - `record.rs` appends, in one transaction, `EmailBounced{source: dsn}` or `EmailComplained`
//!   on the email's stream, the report's digest (`inbound_reports`: a report delivered twice is
//!   recorded once), and the suppression it earns: a hard bounce `bounce`, a complaint
//!   `complaint` (provider suppressions, not removable through the API), soft bounces `bounce`
//!   once `SOFT_BOUNCE_LIMIT` different emails to the address bounced soft within
//!   `SOFT_BOUNCE_WINDOW_SECONDS` (`soft_bounces`, keyed by a keyed digest of the address). The
//!   address suppressed is the one the email was sent to (opened with the contact's key), never
//!   one the report names; an erased contact's report is recorded without a suppression.
//! - The 250 is sent only after that append; a failed append answers 451 (the sender keeps the
//!   message). Mail that is not a report, or names an email the log does not hold, is accepted
//!   and dropped (`inbound_messages_total{outcome}` counts every outcome), so no sender loops.
//!
//! **Email events** reach webhooks: the enqueue worker turns `EmailScheduled`, `EmailSent`,
//! `EmailFailed`, `EmailBounced`, `EmailComplained`, `EmailUnsubscribed`, `EmailOpened` and
//! `EmailClicked` into `email.<type>` deliveries for `email event` webhooks that ask for the
//! type, sealed under the contact's key. The audit trail shows them on channel `email` with
//! the subscription and form events (all have the contact as subject).

pub mod dkim;
pub(crate) mod dkim_sign;
pub mod facts;
pub mod footer;
pub mod inbox;
pub mod mailer;
pub mod message;
pub mod outbox;
pub mod relay;
pub mod render;
pub mod send;
pub mod skipped;
pub mod tracking;

/// Whether `address` is a mailbox address the relay can be given.
pub fn is_address(address: &str) -> bool {
    address.parse::<lettre::Address>().is_ok()
}

/// The enhanced status code (RFC 3463) in `text`: the first `class.subject.detail` token
/// whose class is 2, 4 or 5.
pub fn enhanced_status(text: &str) -> Option<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, ';' | '(' | ')' | ','))
        .find(|token| {
            let parts: Vec<&str> = token.split('.').collect();
            parts.len() == 3
                && matches!(parts[0], "2" | "4" | "5")
                && parts[1..]
                    .iter()
                    .all(|part| (1..=3).contains(&part.len()) && part.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_enhanced_status_is_a_class_subject_detail_token() {
        assert_eq!(enhanced_status("550 5.1.1 user unknown").as_deref(), Some("5.1.1"));
        assert_eq!(enhanced_status("550 user unknown"), None);
    }
}
