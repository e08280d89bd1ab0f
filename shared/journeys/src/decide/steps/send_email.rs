//! `send_email`: the step's email, through the template send's gates, scheduled (or held, or
//! skipped by the gate that refused it).

use domain::workflows::Step;
use mail::outbox;
use mail::send::{Authored, EmailTo, Gate, Verdict, allowance_guard, schedule};
use mail::skipped::{DecidedBy, Skip};
use platform::error::Code;
use serde_json::{Value, json};

use super::super::facts::{Contact, ContactFacts, Facts, Given, Need, Stop};
use super::super::tick::{InFlight, Tick};

/// Starts a `send_email`; `true` when it wrote to another stream.
pub(super) fn start(
    tick: &mut Tick,
    step: &Step,
    (template_id, next): (&str, Option<&str>),
    input: &Value,
    (facts, given, allowance_refused): (&Facts, &Given<'_>, bool),
) -> Result<bool, Stop> {
    let now = given.now;
    let ContactFacts::Live(contact) = facts.contact()? else { return Ok(false) };
    let started = tick.start(step, now);
    let gates = (facts, given, allowance_refused);
    send_email(tick, (&started, next), template_id, input, gates, contact)
}

/// Schedules the step's email through the template send's gates; a refused gate (or the
/// allowance, refused by the append this decision follows) skips it, with the email's
/// `EmailSkipped`.
fn send_email(
    tick: &mut Tick,
    (started, next): (&InFlight, Option<&str>),
    template_id: &str,
    input: &Value,
    (facts, given, allowance_refused): (&Facts, &Given<'_>, bool),
    contact: &Contact,
) -> Result<bool, Stop> {
    let now = given.now;
    let Some(authored) = facts.templates.get(template_id) else {
        return Err(Stop::Needs(Need::Template(template_id.to_owned())));
    };
    let Some(authored) = authored else {
        tick.fail(started, "template_not_found", format!("template {template_id} is gone"), now);
        return Ok(false);
    };
    let template = &authored.template;
    let email_id = domain::workflows::email_id(&tick.row.run_id, started.index);
    let document = contact.state.document();
    let address = document.get("email").and_then(Value::as_str).map(str::to_owned);
    let suppressed = match &address {
        Some(address) => match facts.suppressed.get(address) {
            Some(&suppressed) => suppressed,
            None => return Err(Stop::Needs(Need::Suppression(address.clone()))),
        },
        None => false,
    };
    // Only a marketing send under frequency caps reads the contact's sends.
    let lookback = authored.policy.as_ref().and_then(mail::send::SendPolicy::lookback_ms);
    let sent: &[mail::send::Sent] = match (lookback, &facts.sent) {
        (Some(_), Some(sent)) if template.kind == "marketing" => sent,
        (Some(lookback), None) if template.kind == "marketing" => {
            return Err(Stop::Needs(Need::MarketingSends { since_ms: now - lookback }));
        }
        _ => &[],
    };
    let send_facts = mail::send::Facts {
        kind: mail::send::Kind::of(&template.kind),
        topic_id: template.topic_id.as_deref(),
        contact: Some(mail::send::Contact {
            address: address.as_deref(),
            suppressed,
            consent: contact.consent,
            subscription: template
                .topic_id
                .as_ref()
                .and_then(|topic_id| contact.subscriptions.get(topic_id))
                .map(String::as_str),
            zone: authored
                .policy
                .as_ref()
                .and_then(|policy| policy.time_zone.attribute.as_ref())
                .and_then(|attribute| document.get(attribute))
                .and_then(Value::as_str),
            sent,
        }),
        policy: authored.policy.as_ref(),
        allowance_refused,
        now_ms: now,
    };
    let zone = mail::send::zone_used(&send_facts);
    let follows = mail::send::follows(&send_facts);
    let held = match mail::send::decide(&send_facts) {
        Verdict::Send => None,
        Verdict::Hold { until_ms, gate } => Some((until_ms, gate)),
        Verdict::Skip { gate: Gate::NoAddress, .. } => {
            let message = "the contact has no email address".to_owned();
            tick.finish(started, "skipped", Some((Code::RecipientMissing.as_str(), message)), next, now);
            return Ok(false);
        }
        Verdict::Skip { gate: Gate::Allowance, .. } => {
            let refused = (authored, email_id.as_str(), contact, address.as_deref());
            skip_send(tick, (started, next), (Gate::Allowance, None), (refused, None), now);
            return Ok(true);
        }
        Verdict::Skip { gate, decided_by: filled_by } => {
            let Some(decided_by) = facts.decided_by.get(gate.as_str()) else {
                let (address, topic_id) = (address.unwrap_or_default(), template.topic_id.clone());
                return Err(Stop::Needs(Need::DecidedBy { gate, address, topic_id, filled_by }));
            };
            let refused = (authored, email_id.as_str(), contact, address.as_deref());
            skip_send(tick, (started, next), (gate, decided_by.as_ref()), (refused, zone.as_ref()), now);
            return Ok(true);
        }
    };
    let address = address.unwrap_or_default();
    let Some(key) = &contact.key else {
        tick.fail(started, "no_data_key", "the contact has no data key".to_owned(), now);
        return Ok(false);
    };
    // The recipient's key takes the contact; the others take the input's values of the same
    // name.
    let mut context = serde_json::Map::new();
    for key_name in template.data.keys() {
        let value = if *key_name == template.recipient {
            document.clone()
        } else {
            input.get(key_name).cloned().unwrap_or(Value::Null)
        };
        context.insert(key_name.clone(), value);
    }
    context.insert("input".to_owned(), input.clone());
    let rendered = match mail::send::render_email(authored, &email_id, Value::Object(context), given.site) {
        Ok(rendered) => rendered,
        Err(error) => {
            tick.fail(
                started,
                Code::TemplateRenderFailed.as_str(),
                format!("the template does not render: {error}"),
                now,
            );
            return Ok(false);
        }
    };
    let contact_id = contact.state.record_id.clone();
    let to = EmailTo { space_id: &tick.row.space_id, contact_id: &contact_id, address: &address, key, follows };
    let scheduled = schedule(
        &email_id,
        authored,
        to,
        &rendered,
        mail::send::Origin::workflow(&tick.row.workflow_id, &tick.row.run_id, &started.step_id),
        (now, &given.site.base_url),
    )?
    .decided_in(zone.as_ref());
    if let Some(allowance) = &authored.allowance {
        tick.guards.push(allowance_guard(&tick.row.space_id, now, allowance.monthly));
    }
    // A held email is stored now and decided again at its time by the held sends worker; the
    // run goes on (the step is done when its email is stored, as for one sent at once).
    let output = match held {
        None => {
            tick.streams.push(scheduled.stream);
            tick.guards.push(outbox::insert_guard(&email_id, &tick.row.space_id));
            tick.guards.extend(scheduled.guards);
            tick.email = Some(scheduled.prepared);
            json!({"emailId": email_id})
        }
        Some((until_ms, gate)) => {
            let held = scheduled.hold(until_ms, gate, now);
            tick.streams.push(held.stream);
            tick.guards.push(held.guard);
            json!({"emailId": email_id, "status": "held", "notBefore": platform::time::format_millis(until_ms)})
        }
    };
    tick.finish_with(started, "completed", None, (email_id, Some(output)), next, now);
    Ok(true)
}

/// Skips the step's send: `EmailSkipped` begins the email's stream (the gate, the refusal and
/// the fact that decided), and the step finishes `skipped` naming the email.
fn skip_send(
    tick: &mut Tick,
    (started, next): (&InFlight, Option<&str>),
    (gate, decided_by): (Gate, Option<&DecidedBy>),
    ((authored, email_id, contact, address), zone): (
        (&Authored, &str, &Contact, Option<&str>),
        Option<&mail::send::ZoneUsed>,
    ),
    now: i64,
) {
    let row = &tick.row;
    tick.streams.push(mail::skipped::skipped(Skip {
        email_id,
        space_id: &row.space_id,
        authored,
        contact_id: &contact.state.record_id,
        origin: mail::send::Origin::workflow(&row.workflow_id, &row.run_id, &started.step_id),
        gate,
        decided_by,
        recipient: address.zip(contact.key.as_ref()),
        zone,
        at_ms: now,
    }));
    tick.skip(started, (gate, email_id), next, now);
}
