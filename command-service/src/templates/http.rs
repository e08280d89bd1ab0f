//! `POST /templates/{templateId}/send`.
//!
//! 1. The body is `{data: {<key>: {record fields}}}`; stored content cannot be replaced.
//! 2. Each context record is upserted by identity precedence (or its `id`), decided together.
//!    The holders of every record's identities and the suppression of the address the
//!    recipient's record gives are read in one exchange with the database.
//! 3. The send decision (`mail::send::decide`) is asked about the recipient (the template's
//!    `recipient` key): suppressions for every template, consent and the topic subscription
//!    for marketing; a refusal answers 422 with the gate's code (D9). A contact the recipient's
//!    record matched has its own address, topic statuses and sends read after.
//! 4. The template is rendered; `EmailScheduled` (content sealed under the contact's key) is
//!    appended with the context records, the outbox row and the allowance count, in one
//!    transaction (402 `email_limit_reached` when the month's allowance is used up).
//! 5. The message is handed to the relay inline and the outcome recorded; the answer is
//!    200 `{emailId, status, error}`. A hand-off whose end is unknown answers 503
//!    `idempotency_outcome_unknown` and is never retried blindly.

use domain::email::resources::TEMPLATE;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use mail::facts::{Asked, SendFacts};
use mail::outbox;
use mail::send;
pub use mail::send::{Authored, EmailTo, Scheduled};
use platform::error::{ApiError, Code};
use platform::log::AppendError;
use serde_json::Value;

use super::decide::{self, ContextRecord, HandOff, Loaded, RecipientFacts, SendTemplate, Sent};
use crate::State;
use crate::pipeline::{self, Actor, Answer, Command, Ctx, Decided, Decision, Protection, Refusal, Shell};
use crate::records::decide::parse_input;
use crate::records::decide::{UpsertLoaded, write_schema};
use crate::records::load::upsert_target;
use crate::write_contexts::{self, Kind};
use domain::records::write::identity_values;
use platform::refusal::answered;
use reads::records::identity_owners_of;

/// The template of the caller's space with its sender, domain and the space's allowance: kept
/// by this process since an earlier send at the catalog's revision, or read now in one
/// statement (and kept). A send decided on a kept one appends with that revision's guard.
pub(crate) async fn load_authored(ctx: &Ctx<'_>, space_id: &str, template_id: &str) -> Result<Arc<Authored>, ApiError> {
    if let Some((revision, authored)) = ctx.state.templates.get(space_id, template_id) {
        ctx.kept_catalog(revision);
        return Ok(authored);
    }
    let catalog = ctx.catalog().await?;
    let authored = Authored::load(&ctx.db().await?, &catalog, space_id, template_id)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| decide::Refusal::NotFound(template_id.to_owned()))?;
    let authored = Arc::new(authored);
    if let Some(revision) = ctx.catalog_revision_seen() {
        ctx.state.templates.put(space_id, template_id, revision, &authored);
    }
    Ok(authored)
}

impl Command for SendTemplate<'_> {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Loaded, ApiError> {
        let space_id = self.space_id.as_str();
        let authored = load_authored(ctx, space_id, &self.template_id).await?;
        decide::check_keys(&authored.template, &self.context)?;
        let mut parsed = Vec::with_capacity(authored.template.data.len());
        for (key, expected) in &authored.template.data {
            let schema_context = write_contexts::current(ctx, Kind::Record, space_id, &expected.schema_id).await?;
            let input = self.context.get(key).cloned().unwrap_or_default();
            let input = parse_input(&write_schema(&schema_context, space_id), input).map_err(answered)?;
            parsed.push((key, schema_context, input));
        }
        // The holders of every context record's identities (one statement for every schema) and
        // the suppression of the address the recipient's record gives are read together: sent
        // at once on one connection, they cost this process one exchange with the database.
        let client = ctx.db().await?;
        let given: Vec<&str> = parsed
            .iter()
            .find(|(key, _, _)| **key == authored.template.recipient)
            .and_then(|(_, _, input)| input.identity("email"))
            .into_iter()
            .collect();
        let identities: Vec<_> = parsed.iter().map(|(_, _, input)| identity_values(input)).collect();
        let asked: Vec<(&str, &[(&str, String)])> = parsed
            .iter()
            .zip(&identities)
            .map(|((_, schema_context, _), identities)| {
                (schema_context.schema.schema_id.as_str(), identities.as_slice())
            })
            .collect();
        let (owners, suppressed) = tokio::try_join!(
            identity_owners_of(&client, space_id, &asked),
            mail::facts::suppressed(&client, space_id, &given),
        )?;
        let mut context = BTreeMap::new();
        for ((key, schema_context, input), owners) in parsed.into_iter().zip(owners) {
            let upsert = upsert_target(&client, &write_schema(&schema_context, space_id), input, owners).await?;
            context.insert(key.clone(), ContextRecord { context: schema_context, upsert });
        }
        let recipient = match context.get(&authored.template.recipient) {
            Some(recipient) => recipient_facts(&client, space_id, &authored, &recipient.upsert, suppressed).await?,
            None => RecipientFacts::default(),
        };
        Ok(Loaded { authored, context, recipient })
    }

    fn answer(&self, sent: Sent, shell: &Shell<'_>) -> Result<Decided, ApiError> {
        match sent {
            Sent::Held(outcome) => Ok(outcome.into()),
            Sent::HandOff(hand_off) => {
                let HandOff { streams, mut guards, allowance, email_id, prepared } = *hand_off;
                // The outbox row holds the send's claim: the hand-off records the answer. The
                // row is claimed for this process's hand-off in the same append, so nothing is
                // written between the append and the relay.
                let lease = shell.state.settings.email_lease();
                let claim = shell.claim.map(|claim| claim.parts());
                let (row, lease) = outbox::claimed_guard(&email_id, &self.space_id, claim, lease);
                guards.push(row);
                guards.extend(allowance);
                let unhanded = outbox::Unhanded::new(shell.state.pool.clone(), lease);
                let decision = Decision::new(streams, guards, Answer::json(StatusCode::OK, Value::Null))
                    .if_unwritten(unhanded.on_refusal());
                Ok(Decided::Append(decision.then(super::hand_off::now(prepared, unhanded))))
            }
        }
    }

    fn refused(&self, error: AppendError) -> Refusal {
        match error {
            AppendError::Conflict { code: Code::IdentifierConflict, .. } => Refusal::Again,
            AppendError::Conflict { code: Code::EmailLimitReached, .. } => {
                Refusal::Fail(decide::Refusal::EmailLimitReached.into())
            }
            error => Refusal::default_for(error),
        }
    }

    fn lost_too_often(&self) -> ApiError {
        decide::Refusal::KeptChanging.into()
    }
}

/// What the send decision reads about the recipient whose upsert read `upsert`: the send
/// facts of the contact it matched and of the addresses it may have (the one given, whose
/// suppressions among `given_suppressed` were read with the identities, and the one the
/// contact has), in one statement per kind; nothing more for a new contact.
async fn recipient_facts(
    client: &deadpool_postgres::Client,
    space_id: &str,
    authored: &Authored,
    upsert: &UpsertLoaded,
    given_suppressed: HashSet<String>,
) -> Result<RecipientFacts, ApiError> {
    let target = upsert.target.as_ref().map(|(_, record, _)| record);
    let matched = target.map(|record| record.record_id.clone());
    let given = upsert.input.identity("email");
    let mut addresses: Vec<String> = given.map(str::to_owned).into_iter().collect();
    addresses.extend(target.and_then(|record| record.personal.as_ref()?.email.clone()));
    addresses.dedup();
    let template = &authored.template;
    let lookback =
        authored.policy.as_ref().and_then(send::SendPolicy::lookback_ms).filter(|_| template.kind == "marketing");
    let contact_ids: Vec<String> = matched.iter().cloned().collect();
    let unread: Vec<&str> = addresses.iter().map(String::as_str).filter(|address| Some(*address) != given).collect();
    if contact_ids.is_empty() && unread.is_empty() {
        let facts = SendFacts { suppressed: given_suppressed, ..SendFacts::default() };
        return Ok(RecipientFacts { matched, addresses, facts });
    }
    let asked = Asked {
        space_id,
        contact_ids: &contact_ids,
        addresses: &unread,
        subscriptions: template.topic_id.is_some(),
        sends_since_ms: lookback.map(|lookback| platform::time::now_millis() - lookback),
    };
    // A database failure is answered as one (503, retry), not as a defect.
    let mut facts = SendFacts::load(client, asked).await.map_err(ApiError::from)?;
    facts.suppressed.extend(given_suppressed);
    Ok(RecipientFacts { matched, addresses, facts })
}

#[tracing::instrument(skip_all, fields(template = %path.as_str()))]
pub async fn send(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let body = api::http::read_json_object(&req, payload).await?;
    let context = decide::context(&body)?;
    // The template by its id or its slug, as broadcasts and workflows are named. An id this
    // process keeps the template of needs no lookup: a template deleted since is found gone
    // when the send is decided again at the catalog's new revision.
    let id_or_slug = path.into_inner();
    let template_id = if state.templates.get(caller.space_id(), &id_or_slug).is_some() {
        id_or_slug
    } else {
        pipeline::authored_id(&state, (TEMPLATE, caller.space_id()), id_or_slug).await?
    };
    let command = SendTemplate { space_id: caller.space_id().into(), template_id, context, site: &state.site };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::decide::Refusal;
    use mail::send::Gate;

    #[test]
    fn a_refused_send_answers_with_its_gates_code_and_a_missing_address_is_a_bad_request() {
        assert_eq!(ApiError::from(Refusal::Gate(Gate::NoAddress)).status().as_u16(), 400);
        assert_eq!(ApiError::from(Refusal::Gate(Gate::NoAddress)).code(), Some(Code::RecipientMissing));
        for gate in [Gate::Suppressed, Gate::Consent, Gate::Topic, Gate::FrequencyCap, Gate::QuietHours] {
            assert_eq!(ApiError::from(Refusal::Gate(gate)).status().as_u16(), 422, "{gate:?}");
            assert_eq!(ApiError::from(Refusal::Gate(gate)).code(), Some(gate.code()));
        }
    }
}
