//! A request's messages applied: split into clusters of messages that share an identity
//! (`domain::ingest::clusters`), each cluster's messages one after another, clusters side by
//! side; each message through the command pipeline as the commands of `decide` and the
//! events' own `FireEvent`, so their appends are grouped into shared transactions with every
//! other write of the moment (group commit). What could not be applied is recorded in one
//! append with its reasons.
//!
//! The common case takes a shorter way: a cluster of only tracks, pages and screens of a
//! contact already known by its userId (or its bound anonymous id), with no property left
//! over, needs no contact step; its events are fired with every other such event of the
//! request as an event batch of each schema (`events::decide::batch`, through the pipeline:
//! receipts and subjects read once for all, the new ones appended together), so a batch of
//! 100 tracks costs what 100 events of `POST /events/{schema}/batch` cost.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

use actix_web::HttpRequest;
use actix_web::http::StatusCode;
use actix_web::web;
use domain::catalog::WriteContext;
use domain::ingest::{Kind, Message};
use domain::records::decide::{live_target, parse_input};
use domain::records::write::identity_values;
use futures_util::StreamExt;
use platform::error::{ApiError, Code};
use serde_json::{Map, Value, json};

use super::decide::{Found, JoinGroup, Joined, RecordRefusals, Refused, Resolve, contact_input};
use super::keys::WriteKey;
use crate::State;
use crate::events::decide::FireEvent;
use crate::events::decide::batch::{FireBatch, OnError};
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Refusal as Lost, Shell};
use crate::records::decide::write_schema;
use crate::write_contexts::{self, Kind as ContextKind};

/// Clusters applied at once, at most.
const CLUSTERS_AT_ONCE: usize = 16;

/// What became of one message.
pub(crate) enum Applied {
    Done,
    /// Not applied, with its reason: kept and listed.
    Refused(Refused),
    /// Not admitted now (the space's event rate, a full backlog): the request answers 429 and
    /// the client sends it again.
    Later(ApiError),
}

/// The business event a track, page or screen fires: its schema, its input, and the
/// properties no attribute of the schema holds.
#[derive(Clone)]
pub(crate) struct Event {
    schema_id: String,
    input: Map<String, Value>,
    kept: Map<String, Value>,
}

/// What a request's messages came to.
pub(crate) struct Report {
    pub applied: usize,
    pub refused: Vec<(usize, Refused)>,
    /// The first refusal of admission, when a message was not admitted.
    pub later: Option<ApiError>,
}

/// Applies `messages` (index → message, or why it could not be read) with `key`.
pub(crate) async fn apply(
    state: &web::Data<State>,
    req: &HttpRequest,
    key: Arc<WriteKey>,
    messages: Vec<Result<Message, Refused>>,
) -> Result<Report, ApiError> {
    let mut report = Report { applied: 0, refused: Vec::new(), later: None };
    let mut readable: Vec<(usize, Arc<Message>)> = Vec::new();
    for (index, message) in messages.into_iter().enumerate() {
        match message {
            Ok(message) => readable.push((index, Arc::new(message))),
            Err(refused) => report.refused.push((index, refused)),
        }
    }
    let slugs = event_schema_slugs(state, &key.space_id).await?;
    // Every event's schema and input, read once (the schemas' contexts are kept).
    let mut events: BTreeMap<usize, Event> = BTreeMap::new();
    for (position, (index, message)) in readable.iter().enumerate() {
        if message.kind.is_event() {
            match event_input(state, &key, message, &slugs).await {
                Ok(event) => {
                    events.insert(position, event);
                }
                Err(applied) => record(&mut report, *index, applied),
            }
        }
    }
    let refs: Vec<&Message> = readable.iter().map(|(_, message)| &**message).collect();
    let known = known_contacts(state, &key, &refs).await?;
    let (mut quick, mut clusters) = (Vec::new(), Vec::new());
    for cluster in domain::ingest::clusters(&refs) {
        let contacts: Option<Vec<String>> = cluster
            .iter()
            .map(|position| {
                let (_, message) = &readable[*position];
                let event = events.get(position)?;
                known.contact_of(message).filter(|_| event.kept.is_empty())
            })
            .collect();
        match contacts {
            Some(contacts) => quick.extend(cluster.into_iter().zip(contacts)),
            None => clusters.push(cluster),
        }
    }
    // A message whose event could not be read was answered above; it goes no further.
    clusters.iter_mut().for_each(|cluster| {
        cluster.retain(|position| !readable[*position].1.kind.is_event() || events.contains_key(position));
    });
    for (index, applied) in fire_known(state, req, &key, &readable, (quick, &mut events)).await? {
        record(&mut report, index, applied);
    }
    let key = &key;
    let readable = &readable;
    let events = &events;
    let results: Vec<Vec<(usize, Applied)>> =
        futures_util::stream::iter(clusters.into_iter().map(|cluster| async move {
            let mut outcomes = Vec::with_capacity(cluster.len());
            for position in cluster {
                let (index, message) = &readable[position];
                let applied = apply_one(state, req, key, message, events.get(&position).cloned()).await;
                outcomes.push((*index, applied));
            }
            outcomes
        }))
        .buffer_unordered(CLUSTERS_AT_ONCE)
        .collect()
        .await;
    for (index, applied) in results.into_iter().flatten() {
        record(&mut report, index, applied);
    }
    report.refused.sort_by_key(|(index, _)| *index);
    Ok(report)
}

fn record(report: &mut Report, index: usize, applied: Applied) {
    match applied {
        Applied::Done => report.applied += 1,
        Applied::Refused(refused) => report.refused.push((index, refused)),
        Applied::Later(error) => {
            report.later.get_or_insert(error);
        }
    }
}

/// The contacts a request's messages name that exist already: by userId (the write key's
/// contact schema) and by anonymous id (the bound aliases of its source), read in two
/// statements for the whole request.
struct Known {
    by_user: BTreeMap<String, String>,
    /// Anonymous id → its alias's contact.
    by_anonymous: BTreeMap<String, String>,
}

impl Known {
    /// The contact a message is about without a contact step: its userId's holder (when its
    /// anonymous id, if any, already names the same), or its bound anonymous id's contact.
    fn contact_of(&self, message: &Message) -> Option<String> {
        let by_anonymous = message.anonymous_id.as_ref().map(|anonymous| self.by_anonymous.get(anonymous));
        match (&message.user_id, by_anonymous) {
            (Some(user_id), None) => self.by_user.get(user_id).cloned(),
            (Some(user_id), Some(bound)) => {
                let holder = self.by_user.get(user_id)?;
                (bound == Some(holder)).then(|| holder.clone())
            }
            (None, Some(bound)) => bound.cloned(),
            (None, None) => None,
        }
    }
}

async fn known_contacts(state: &State, key: &WriteKey, messages: &[&Message]) -> Result<Known, ApiError> {
    let users: Vec<(&str, String)> =
        messages.iter().filter_map(|message| Some(("userId", message.user_id.clone()?))).collect();
    let mut digests: BTreeMap<String, String> = BTreeMap::new();
    for anonymous in messages.iter().filter_map(|message| message.anonymous_id.as_ref()) {
        let digest =
            platform::crypto::keyed_digest("alias", &format!("{}\0{anonymous}", key.source)).map_err(ApiError::from)?;
        digests.insert(digest, anonymous.clone());
    }
    let client = state.pool.get().await?;
    let owners = reads::records::identity_owners(&client, &key.space_id, &key.contact_schema_id, &users).await?;
    let by_user = owners.into_iter().map(|((_, user_id), contact_id)| (user_id, contact_id)).collect();
    let wanted: Vec<&String> = digests.keys().collect();
    let statement = client
        .prepare_cached(
            "SELECT alias_digest, contact_id FROM identity_aliases
             WHERE space_id = $1 AND alias_digest = ANY($2) AND contact_id IS NOT NULL AND NOT erased",
        )
        .await?;
    let mut by_anonymous = BTreeMap::new();
    for row in client.query(&statement, &[&key.space_id, &wanted]).await? {
        let (digest, contact_id): (String, String) = (row.get(0), row.get(1));
        if let Some(anonymous) = digests.get(&digest) {
            by_anonymous.insert(anonymous.clone(), contact_id);
        }
    }
    Ok(Known { by_user, by_anonymous })
}

/// Fires the events of known contacts (`quick`: message positions with their contact), each
/// event schema's at once, as an event batch fires its items.
async fn fire_known(
    state: &web::Data<State>,
    req: &HttpRequest,
    key: &WriteKey,
    readable: &[(usize, Arc<Message>)],
    (quick, events): (Vec<(usize, String)>, &mut BTreeMap<usize, Event>),
) -> Result<Vec<(usize, Applied)>, ApiError> {
    // Per event schema: the messages' indexes and their inputs, in the same order.
    type Fires = (Vec<usize>, Vec<Map<String, Value>>);
    let mut by_schema: BTreeMap<String, Fires> = BTreeMap::new();
    for (position, contact_id) in quick {
        let Some(Event { schema_id, mut input, .. }) = events.remove(&position) else { continue };
        input.insert("contactId".to_owned(), Value::String(contact_id));
        let (indexes, inputs) = by_schema.entry(schema_id).or_default();
        indexes.push(readable[position].0);
        inputs.push(input);
    }
    let mut applied = Vec::new();
    for (schema_id, (indexes, inputs)) in by_schema {
        let batch = FireBatch {
            space_id: key.space_id.clone().into(),
            schema_ref: schema_id,
            events: inputs.into_iter().map(Value::Object).collect(),
            on_error: OnError::Continue,
            admission_refused: Cell::new(false),
        };
        let actor = Actor::WriteKey { space_id: &key.space_id, write_key_id: &key.id };
        match pipeline::run(state, req, actor, batch).await {
            Ok((answer, _)) => {
                let results = json_of(&answer).and_then(|body| body["data"]["results"].as_array());
                for (index, result) in indexes.into_iter().zip(results.into_iter().flatten()) {
                    applied.push((index, item_applied(result)));
                }
            }
            // The store away: the request answers it and the client sends it again.
            Err(error) if error.status().is_server_error() => return Err(error),
            // The schema gone, or its eventIds fired concurrently through every attempt.
            Err(error) => applied.extend(indexes.into_iter().map(|index| (index, refused_by(&error)))),
        }
    }
    Ok(applied)
}

/// What became of an event fired as a batch's item, read from its result as the batch answers
/// it (`{status, error?, retryAfterMilliseconds?}`).
fn item_applied(result: &Value) -> Applied {
    if result["status"] == "accepted" {
        return Applied::Done;
    }
    let error = &result["error"];
    let code = error["code"].as_str().and_then(Code::parse).unwrap_or(Code::InternalError);
    let mut refused = ApiError::of(code, error["message"].as_str().unwrap_or_default());
    if let Some(retry_ms) = result["retryAfterMilliseconds"].as_u64() {
        refused = refused.with_header("Retry-After", retry_ms.div_ceil(1000).max(1).to_string());
    }
    refused_by(&refused)
}

/// The slugs of the space's event schemas, to their ids.
async fn event_schema_slugs(state: &State, space_id: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let catalog = pipeline::edge_catalog(state).await?;
    let client = state.pool.get().await?;
    Ok(reads::catalog::schema_slugs(&client, &catalog, space_id, "event").await?)
}

/// A pipeline answer or error as what became of a message.
fn refused_by(error: &ApiError) -> Applied {
    if error.status() == StatusCode::TOO_MANY_REQUESTS {
        return Applied::Later(error.clone());
    }
    Applied::Refused(Refused::new(error.code().unwrap_or(Code::InternalError), error.message().to_owned()))
}

fn json_of(answer: &pipeline::Answer) -> Option<&Value> {
    match &answer.body {
        pipeline::Rendered::Json(body) => Some(body),
        pipeline::Rendered::Html(_) => None,
    }
}

/// Applies one message of a cluster: its contact step, then its event or its group. An event's
/// schema and input (`event`) were read beforehand; the properties none of its attributes hold
/// are kept with the contact's step.
async fn apply_one(
    state: &web::Data<State>,
    req: &HttpRequest,
    key: &Arc<WriteKey>,
    message: &Arc<Message>,
    event: Option<Event>,
) -> Applied {
    let actor = || Actor::WriteKey { space_id: &key.space_id, write_key_id: &key.id };
    let kept = event.as_ref().map(|event| event.kept.clone()).unwrap_or_default();
    let resolve = Resolve { key: Arc::clone(key), message: Arc::clone(message), kept };
    let contact_id = match pipeline::run(state, req, actor(), resolve).await {
        Ok((answer, _)) => match json_of(&answer).and_then(|body| body["contactId"].as_str()) {
            Some(contact_id) => contact_id.to_owned(),
            None => return Applied::Refused(Refused::new(Code::InternalError, "the contact step answered no contact")),
        },
        Err(error) => return refused_by(&error),
    };
    match message.kind {
        Kind::Identify | Kind::Alias => Applied::Done,
        Kind::Track | Kind::Page | Kind::Screen => {
            let Some(Event { schema_id, mut input, .. }) = event else { return Applied::Done };
            input.insert("contactId".to_owned(), Value::String(contact_id));
            let fire = FireEvent {
                space_id: key.space_id.clone().into(),
                schema_ref: schema_id,
                input,
                admission_refused: Cell::new(false),
            };
            match pipeline::run(state, req, actor(), fire).await {
                Ok(_) => Applied::Done,
                Err(error) => refused_by(&error),
            }
        }
        Kind::Group => {
            if key.group.is_none() {
                return Applied::Refused(Refused::new(
                    Code::SchemaNotFound,
                    format!("write key {:?} names no group schema: declare `group` on it to take groups", key.slug),
                ));
            }
            let join = JoinGroup { key: Arc::clone(key), message: Arc::clone(message), contact_id };
            match pipeline::run(state, req, actor(), join).await {
                Ok(_) => Applied::Done,
                Err(error) => refused_by(&error),
            }
        }
    }
}

/// The event a track, page or screen fires: its schema (id), its input (`eventId` the
/// message's id, `occurredAt` its timestamp, the attributes its properties fill) and the
/// properties no attribute holds.
async fn event_input(
    state: &State,
    key: &WriteKey,
    message: &Message,
    slugs: &BTreeMap<String, String>,
) -> Result<Event, Applied> {
    let not_found = |reason: String| Applied::Refused(Refused::new(Code::SchemaNotFound, reason));
    let schema_id = match message.kind {
        Kind::Track => {
            let event = message.event.as_deref().unwrap_or_default();
            domain::ingest::event_schema_for(event, &key.events, slugs).cloned().ok_or_else(|| {
                not_found(format!(
                    "no event schema records {event:?}: name one for it in the write key's `events`, or define one \
                     with slug {:?}",
                    domain::ingest::slug_of(event)
                ))
            })?
        }
        Kind::Page => key.page_schema_id.clone().or_else(|| slugs.get("page").cloned()).ok_or_else(|| {
            not_found("no event schema records pages: name one in the write key's `page`, or define one with slug \"page\"".to_owned())
        })?,
        _ => key.screen_schema_id.clone().or_else(|| slugs.get("screen").cloned()).ok_or_else(|| {
            not_found(
                "no event schema records screens: name one in the write key's `screen`, or define one with slug \"screen\""
                    .to_owned(),
            )
        })?,
    };
    let context = write_contexts::at_edge(state, ContextKind::Event, &key.space_id, &schema_id)
        .await
        .map_err(|error| refused_by(&error))?;
    let mut properties = message.properties.clone();
    // A page's or a screen's own fields, beside its properties (Segment's page shape).
    if matches!(message.kind, Kind::Page | Kind::Screen) {
        for (field, value) in [("name", &message.name), ("category", &message.category)] {
            if let Some(value) = value {
                properties.entry(field.to_owned()).or_insert_with(|| Value::String(value.clone()));
            }
        }
    }
    let (mut input, kept) = domain::ingest::matched(&properties, &context.attributes, &[]);
    input.insert("eventId".to_owned(), Value::String(message.message_id.clone()));
    if let Some(at_ms) = message.timestamp_ms {
        input.insert("occurredAt".to_owned(), Value::String(platform::time::format_millis(at_ms)));
    }
    Ok(Event { schema_id, input, kept })
}

impl Command for Resolve {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Found, ApiError> {
        let (key, message) = (&*self.key, &*self.message);
        let context: Arc<WriteContext> =
            write_contexts::current(ctx, ContextKind::Record, &key.space_id, &key.contact_schema_id).await?;
        let schema = write_schema(&context, &key.space_id);
        let (raw, mut kept) = contact_input(message, &context);
        kept.extend(self.kept.clone());
        let input = parse_input(&schema, raw).map_err(super::decide::Refusal::from)?;
        let client = ctx.db().await?;
        let owners =
            reads::records::identity_owners(&client, &key.space_id, &key.contact_schema_id, &identity_values(&input))
                .await?;
        let anonymous = match message.kind {
            Kind::Alias => message.previous_id.as_deref(),
            _ => message.anonymous_id.as_deref(),
        };
        let alias = match anonymous {
            Some(anonymous) => {
                let digest = platform::crypto::keyed_digest("alias", &format!("{}\0{anonymous}", key.source))
                    .map_err(ApiError::from)?;
                let alias = crate::identities::store::load_alias(&client, &key.space_id, &digest).await?;
                Some((digest, alias))
            }
            None => None,
        };
        let holder = |identity: &str, value: Option<&str>| -> Option<String> {
            owners.get(&(identity.to_owned(), value?.to_owned())).cloned()
        };
        let by_user_id = holder("userId", message.user_id.as_deref());
        let by_email_id = match message.kind {
            Kind::Identify => holder("email", input.identity("email")),
            _ => None,
        };
        let by_alias_id = alias.as_ref().and_then(|(_, alias)| alias.contact_id.clone());
        let wanted: Vec<String> = [&by_user_id, &by_alias_id, &by_email_id].into_iter().flatten().cloned().collect();
        let mut loaded: BTreeMap<String, (i64, domain::records::Loaded)> =
            reads::records::load_records(&client, &wanted)
                .await
                .map_err(ApiError::from)?
                .into_iter()
                .map(|(id, version, loaded)| (id, (version, loaded)))
                .collect();
        // The userId's holder under deletion refuses the message (its identity is still claimed).
        let by_user = match &by_user_id {
            Some(id) => Some(live_target(&schema, id, loaded.remove(id)).map_err(super::decide::Refusal::from)?),
            None => None,
        };
        let mut target =
            |id: &Option<String>| id.as_ref().and_then(|id| live_target(&schema, id, loaded.remove(id)).ok());
        let by_alias = target(&by_alias_id);
        let by_email = target(&by_email_id);
        Ok(Found {
            context,
            input,
            kept,
            owners,
            by_user,
            alias,
            by_alias,
            by_email,
            capacity: ctx.state.settings.identity,
        })
    }

    fn answer(&self, outcome: crate::decision::Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn refused(&self, error: platform::log::AppendError) -> Lost {
        ingest_lost(error)
    }
}

/// A lost race of a contact step (an identity claimed, the alias moved on, a stream moved):
/// decide again on what is there now.
fn ingest_lost(error: platform::log::AppendError) -> Lost {
    use platform::log::AppendError;
    match error {
        AppendError::Conflict {
            code: Code::IdentifierConflict | Code::AliasRevisionConflict | Code::OperationTaken,
            ..
        } => Lost::Again,
        error => Lost::default_for(error),
    }
}

impl Command for JoinGroup {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Joined, ApiError> {
        let (key, message) = (&*self.key, &*self.message);
        let Some((object_schema_id, contact_attribute)) = &key.group else {
            return Err(ApiError::internal(&anyhow::anyhow!("a group join without a group schema")));
        };
        let object_context = write_contexts::current(ctx, ContextKind::Record, &key.space_id, object_schema_id).await?;
        let contact_context =
            write_contexts::current(ctx, ContextKind::Record, &key.space_id, &key.contact_schema_id).await?;
        let object_schema = write_schema(&object_context, &key.space_id);
        let (mut raw, _) = domain::ingest::matched(&message.traits, &object_context.attributes, &[]);
        raw.insert("externalId".to_owned(), Value::String(message.group_id.clone().unwrap_or_default()));
        let input = parse_input(&object_schema, raw).map_err(super::decide::Refusal::from)?;
        let client = ctx.db().await?;
        let owners =
            reads::records::identity_owners(&client, &key.space_id, object_schema_id, &identity_values(&input)).await?;
        let object_id = owners.get(&("externalId".to_owned(), message.group_id.clone().unwrap_or_default())).cloned();
        let ids: Vec<String> = object_id.iter().cloned().chain([self.contact_id.clone()]).collect();
        let mut loaded: BTreeMap<String, (i64, domain::records::Loaded)> = reads::records::load_records(&client, &ids)
            .await
            .map_err(ApiError::from)?
            .into_iter()
            .map(|(id, version, loaded)| (id, (version, loaded)))
            .collect();
        let object = match &object_id {
            Some(id) => Some(live_target(&object_schema, id, loaded.remove(id)).map_err(super::decide::Refusal::from)?),
            None => None,
        };
        let contact_schema = write_schema(&contact_context, &key.space_id);
        let contact = live_target(&contact_schema, &self.contact_id, loaded.remove(&self.contact_id))
            .map_err(super::decide::Refusal::from)?;
        Ok(Joined {
            object_context,
            contact_context,
            input,
            owners,
            object,
            contact,
            contact_attribute: contact_attribute.clone(),
        })
    }

    fn answer(&self, outcome: crate::decision::Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn refused(&self, error: platform::log::AppendError) -> Lost {
        ingest_lost(error)
    }
}

impl Command for RecordRefusals {
    async fn load(&self, _: &Ctx<'_>) -> Result<(), ApiError> {
        Ok(())
    }

    fn answer(&self, outcome: crate::decision::Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }
}

/// Records what could not be applied, in one append; the messages are the request's items,
/// as sent.
pub(crate) async fn record_refusals(
    state: &web::Data<State>,
    req: &HttpRequest,
    key: &WriteKey,
    refused: &[(usize, Refused)],
    items: &[Value],
    kinds: &[Option<Kind>],
) -> Result<(), ApiError> {
    if refused.is_empty() {
        return Ok(());
    }
    let rows = refused
        .iter()
        .map(|(index, refusal)| {
            let item = items.get(*index).cloned().unwrap_or(Value::Null);
            let message_id = item.get("messageId").and_then(Value::as_str).unwrap_or_default().to_owned();
            let kind = kinds.get(*index).copied().flatten().map_or("unknown", Kind::as_str).to_owned();
            (message_id, kind, refusal.clone(), item)
        })
        .collect();
    let command = RecordRefusals { space_id: key.space_id.clone().into(), write_key_id: key.id.clone(), rows };
    let actor = Actor::WriteKey { space_id: &key.space_id, write_key_id: &key.id };
    pipeline::run(state, req, actor, command).await?;
    Ok(())
}

/// The JSON of a report's failures, as the answer lists them.
pub(crate) fn failures_json(refused: &[(usize, Refused)], items: &[Value]) -> Value {
    Value::Array(
        refused
            .iter()
            .map(|(index, refusal)| {
                json!({
                    "index": index,
                    "messageId": items.get(*index).and_then(|item| item.get("messageId")).cloned().unwrap_or(Value::Null),
                    "code": refusal.code.as_str(),
                    "message": refusal.reason,
                })
            })
            .collect(),
    )
}
