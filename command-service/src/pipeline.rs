//! The write path: every command goes through [`execute`].
//!
//! 1. **At the edge** (the handler): authenticate and authorize ([`authorize`],
//!    [`authorize_with_body`]), read and parse the body into the command. Nothing is recorded
//!    yet.
//! 2. **Admit**: under `Idempotency-Key` (the contract's 17 operations) the operation is
//!    claimed, or answered from an earlier one ([`crate::idempotency`]).
//! 3. **Load** ([`Command::load`]) the state the decision needs through [`Ctx`], which gives
//!    only fresh reads: the log's streams (with their versions), the write side's guard
//!    tables (written in the append transactions themselves), and the catalog, whose
//!    revision is remembered and guards the append.
//! 4. **Decide** ([`Decide::decide`], in the capability's `decide.rs`): a pure function of
//!    the loaded state, the command and what it is [`Given`] (the time, the operation's id,
//!    new ids, data keys and tokens); the streams to append (each at the version it was
//!    loaded at), the guards and the reply, as data, or a refusal, answered through its
//!    `platform::refusal::Refusal` impl. The shell ([`Command::answer`]) turns the outcome
//!    into the HTTP answer and the work that follows the append.
//! 5. **Append** once: the decision's streams and guards, the catalog revision guard, and the
//!    idempotent completion (the answer recorded in the same transaction).
//! 6. **Again** when the append lost a race ([`Command::refused`]: a stream moved on, the
//!    catalog changed, a uniqueness claim was taken), from step 3, a bounded number of times.
//! 7. **Answer**: the status and body, `Operation-Id`, and `Consistency-Token`.
//!
//! So freshness, idempotency and the contract's answers to a failed append are decided here,
//! once. Read models other than the catalog are never read on the write path: a command
//! decides on the log (below, "Deciding on fresh state").
//!
//! # Life of a write
//!
//! Every command goes through one pipeline (`command-service/src/pipeline.rs`, in the manner of
//! cqrs-es's `execute`), but three: the items of an event batch (commands of their own); an
//! import's intake (`imports/http.rs` and the operator's `import`: the settings and parts go into
//! `imports` and `import_parts`, tables of the command side, not the log; the projector's
//! `imports` worker appends each row's write, see Imports); and the clicks and opens of tracking
//! links (`engagement/http.rs`: public, with no key, claim or
//! catalog, answered with a redirect or an image once taken into `engagement_inbox`, one
//! committed row, inserted with the hits of concurrent requests; the projector's `engagement` worker appends them to the log, see Engagement). A handler authorizes and parses at the edge into a `Command`; the
//! pipeline admits it under `Idempotency-Key`, runs the command's `load` (through `Ctx`, which
//! gives fresh reads only: see Deciding on fresh state), then its pure `Decide::decide` (in the
//! capability's `decide.rs`, given the time, the operation's id and a `Fresh`), turns the outcome
//! into the answer (`Command::answer`; a refusal becomes the envelope through its
//! `platform::refusal::Refusal` impl), appends the
//! decision once with its guards, the catalog revision guard and the idempotent completion,
//! decides again when the append lost a race (`Command::refused`: a stream not at its loaded
//! version, a moved catalog or authored resource, a taken uniqueness claim), and answers with
//! `Operation-Id` and `Consistency-Token`. The pipeline knows no capability: work after an
//! acknowledged append is the decision's `Then`, a closure the capability supplies (the inline
//! hand-off of a template send, `templates/hand_off.rs`, whose outcome is the answer; a form's
//! confirmation email, handed off after the answer), and the kept catalog contexts it prunes
//! when the catalog moves on are the list `State::kept` names. A handler returns
//! `Result<HttpResponse, ApiError>`; the route table registers it through `api::http::answering`,
//! which answers an `Err` in the contract's envelope, and a handler that panics with 500
//! `internal_error` (the panic logged in the request's span) instead of a dropped connection. An event batch
//! (`events/decide/batch.rs`, both `onError` modes) is a command like any other.
//!
//! `POST /v1/schemas/contacts/records`:
//! 1. `request_id_middleware` gives the request an id (its tracing span covers the request);
//!    `request_metrics_middleware` will count it under its operation id (`createRecord`, from
//!    the route table, looked up once and kept in the request's extensions for the middleware
//!    after it); `storable_input_middleware` refuses a NUL in a path or query parameter.
//! 2. `Authenticator::authorize` counts the request in its rate-limit bucket, hashes the bearer
//!    key, looks it up in the catalog read model (cached for `APP__AUTH__CACHE_MILLIS`, default
//!    500 ms, so a revoked key stops working everywhere at most that long after the catalog read
//!    model has the revocation: well within a second of the apply on a machine that is not
//!    saturated), resolves the space, checks `write`.
//! 3. `read_json_object` enforces 10 MB, at most 250,000 JSON values (counted on the bytes
//!    before the body is parsed), `application/json`, UTF-8, no content encoding, and
//!    refuses a NUL anywhere in the body (400 `invalid_character`, naming the field). The
//!    schema is resolved (`write_contexts::at_edge`) before any claim: an unknown schema records
//!    nothing.
//! 4. The pipeline claims the `Idempotency-Key` if one was sent. The command's `load` takes the
//!    schema and its attributes from the process's write-context cache
//!    (`domain::catalog::WriteContexts`), or reads them (with the space's credits and the
//!    catalog's revision) from the catalog in one statement. A schema with AI auto-fill is
//!    always read afresh, for its credits. Either way `Ctx` remembers the catalog revision.
//! 5. `records::decide::decide_create` (pure) validates, applies defaults, and returns the
//!    `RecordCreated` event and the identities it claims — or a `RecordRefusal`, which its
//!    `From` impl beside it (`domain::records::decide`) turns into the contract's envelope.
//! 6. `EventLog::append` queues the command; the batcher writes it (stream version, the identity
//!    guards from `records/store.rs`, the data key, the idempotency outcome, the catalog
//!    revision guard, events, the key's latest position) in one transaction and answers with
//!    its position. If the revision guard refuses (the catalog changed since the context was
//!    read), or the decision on a kept context refused the input while the catalog has moved
//!    on, the pipeline drops the kept contexts of older revisions and decides again on a fresh
//!    read: the cache never answers for a catalog that has changed.
//! 7. 201 with the record, `Operation-Id`, and `Consistency-Token` (the log position).
//!
//! # Deciding on fresh state
//!
//! **Architecture Invariant: a command decides on state at least as new as every write
//! acknowledged before it, and appends only if that state has not moved.** What a command
//! reads comes through the pipeline's `Ctx`, and is one of three kinds:
//!
//! - **The log's streams**, read directly (`platform::log::read_streams`, the record loader, a
//!   webhook's or segment's fold): as new as every acknowledged write by construction. The
//!   append goes at the loaded version of the stream it writes (`ExpectedVersion::Exactly`),
//!   and a stream it only read is held where it was by `Guard::stream_at`; so two concurrent
//!   PATCHes are ordered (the second is decided again on the first's result), and a broadcast
//!   updated while it is sent goes out wholly before or wholly after the update.
//! - **The write side's guard tables** (`record_identities`, suppression keys, receipts,
//!   `broadcast_runs`, `form_tokens`, the outbox, idempotency records): written in the append
//!   transactions themselves, so they too hold every acknowledged write.
//! - **Authored catalog data**, the one read model a command may read, at whatever position it
//!   has reached (`Ctx::catalog`), because it is guarded: the catalog's revision is read first
//!   (or in the same statement as the data) and the append carries
//!   `catalog::revision_guard`, so a decision on a catalog that changed meanwhile is decided
//!   again. The operator's apply with `--wait` (and the single node's apply at start) returns
//!   only once the catalog holds what it wrote, so an acknowledged authoring change is never
//!   missed. A running system follows an apply without a restart: the caches of authored data
//!   are keyed by what they hold (`catalog::WriteContexts` by catalog revision, the workflow
//!   engine's definitions by workflow revision, parsed Liquid templates and DKIM signers by
//!   their source), and the one kept by time, API-key lookups, expires after
//!   `APP__AUTH__CACHE_MILLIS` (500 ms).
//!
//! **Architecture Invariant: no command reads another read model.** No module of the command
//! service but `pipeline.rs` touches `ReadModels` (a unit test reads the sources to hold this),
//! and checks at the edge (before a claim) read the catalog only. Background work that must act
//! on a read model as of a command's position waits for it: a broadcast run's start snapshots
//! its audience from the `segments` read model only once that model has applied the run's
//! request.

use std::cell::{Cell, RefCell};
use std::future::Future;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::{Caller, Permission};
use api::ratelimit::Bucket;
use domain::catalog::CATALOG;
use platform::error::{ApiError, Code};
use platform::log::{AppendError, AppendRequest, Appended, Guard, Metadata, StreamAppend};
use serde_json::{Map, Value};

use crate::State;
use crate::decision::{Body, Decide, Given, Outcome, Reply, Status, Writes};
use crate::idempotency::{self, Admission, Claim};
use platform::fresh::Drawn;

/// How often a command whose append lost a race is decided again, by default.
pub(crate) const ATTEMPTS: usize = 3;

/// Who runs a command.
pub enum Actor<'a> {
    /// An API key acting in its resolved space.
    Key(&'a Caller),
    /// A public endpoint (no key): the tenant is the addressed resource's, which the decision
    /// names ([`Decision::in_space`]).
    Public,
    /// A write key of the Segment-compatible ingest (`write_key_id`), acting in its space: its
    /// writes are recorded as the write key's.
    WriteKey { space_id: &'a str, write_key_id: &'a str },
}

/// Whether `Idempotency-Key` protects a command, and the body identity it is claimed with.
pub enum Protection<'a> {
    /// One of the contract's 17 operations: claimed under the caller's key (when sent) with
    /// the canonical hash of this value.
    Keyed(&'a Value),
    /// No idempotency record: the command answers with a fresh `Operation-Id` each time.
    Unkeyed,
}

/// A command of the API, the shell around its decision ([`Decide`], in the capability's
/// `decide.rs`): what it reads, and how its outcome is appended and answered.
pub trait Command: Decide<Refusal: Into<ApiError>> {
    /// Reads what the decision needs through `ctx` (fresh reads only).
    fn load(&self, ctx: &Ctx<'_>) -> impl Future<Output = Result<Self::Loaded, ApiError>>;

    /// The decided outcome as the pipeline appends and answers it (with the work that follows
    /// the append, if any).
    fn answer(&self, outcome: Self::Outcome, shell: &Shell<'_>) -> Result<Decided, ApiError>;

    /// What a refused append means for this command. By default a lost race (a stream not at
    /// its loaded version, a moved catalog or authored resource) is decided again, and any
    /// other failure is the contract's answer to it.
    fn refused(&self, error: AppendError) -> Refusal {
        Refusal::default_for(error)
    }

    /// How often the command is decided when its appends keep losing races.
    fn attempts(&self) -> usize {
        ATTEMPTS
    }

    /// The answer when every attempt lost a race.
    fn lost_too_often(&self) -> ApiError {
        ApiError::of(Code::ConcurrentModification, "the resource kept changing while this write was applied; retry")
    }
}

/// What the shell's [`Command::answer`] is given.
pub struct Shell<'a> {
    /// The operation's id (`Operation-Id`).
    pub operation_id: &'a str,
    /// The idempotency claim, for an outcome whose completion another party records (an
    /// email's hand-off).
    pub claim: Option<&'a Claim>,
    /// The service's state, for what an answer takes beyond the decision (a send's inline
    /// hand-off holds a pool to give its claim back).
    pub state: &'a State,
}

/// The common outcome, appended and answered as it is.
impl From<Outcome> for Decided {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Append(Writes { streams, guards, reply, space_id }) => Decided::Append(Decision {
                streams,
                guards,
                answer: reply.into(),
                space_id,
                then: None,
                unwritten: None,
            }),
            Outcome::Answer(reply) => Decided::Answer(reply.into()),
            Outcome::Again => Decided::Again,
        }
    }
}

impl From<Reply> for Answer {
    fn from(reply: Reply) -> Self {
        let status = match reply.status {
            Status::Ok => StatusCode::OK,
            Status::Created => StatusCode::CREATED,
            Status::Accepted => StatusCode::ACCEPTED,
        };
        let body = match reply.body {
            Body::Data { data, warnings } => Rendered::Json(api::http::data_body(data, &warnings)),
            Body::Json(body) => Rendered::Json(body),
            Body::Page(said) => Rendered::Html(page(&said)),
        };
        Self { status, body }
    }
}

/// A reply's page as the browser gets it (`None` for JSON): for decisions' tests.
#[cfg(test)]
pub(crate) fn html_of(reply: &Reply) -> Option<String> {
    let Body::Page(said) = &reply.body else { return None };
    Some(page(said))
}

/// A decision's success page as the browser gets it.
pub(crate) fn page(page: &crate::decision::Page) -> String {
    let paragraphs: Vec<&str> = page.paragraphs.iter().map(String::as_str).collect();
    let mut message = api::pages::Message::success(&page.title, &paragraphs);
    if let Some((href, text)) = &page.link {
        message = message.with_link(href.as_str(), text.as_str());
    }
    message.in_language_of(&page.words).page()
}

/// What a command decided.
pub enum Decided {
    /// Append this, then answer.
    Append(Decision),
    /// Nothing to write: answer (and record the answer for an idempotent replay).
    Answer(Answer),
    /// The decision needs more than this attempt loaded (an optimistic first attempt that
    /// skipped a lookup): load and decide again.
    Again,
}

/// The streams and guards to append in one transaction, and the answer once appended.
pub struct Decision {
    pub streams: Vec<StreamAppend>,
    pub guards: Vec<Guard>,
    pub answer: Answer,
    /// The space a public command writes in (an API key's is its own).
    space_id: Option<String>,
    /// Work after the append that the answer waits for or leaves running.
    then: Option<Then>,
    /// Called when the append is refused for certain (anything but an unknown outcome): it
    /// wrote nothing, so what the decision set up for its rows can stand down.
    unwritten: Option<Box<dyn FnOnce() + Send>>,
}

/// Work a command does once its append is acknowledged.
pub enum Then {
    /// Work the answer waits for, whose outcome is the answer (with the position it recorded,
    /// for the consistency token). It records the idempotent completion itself, so the append
    /// carries none.
    Finish(Effect<Result<(Answer, Appended), ApiError>>),
    /// Work left running after the answer (a worker is its backstop).
    Detach(Effect<()>),
    /// The answer follows from where the append landed (an id derived from its position); for
    /// a command no idempotency record holds (its answer is recorded before the append).
    Answer(Box<dyn FnOnce(Appended) -> Answer>),
}

/// Work after an acknowledged append, given the service's state.
pub(crate) type Effect<T> = Box<dyn FnOnce(web::Data<State>) -> futures_util::future::BoxFuture<'static, T> + Send>;

impl Decision {
    pub fn new(streams: Vec<StreamAppend>, guards: Vec<Guard>, answer: Answer) -> Self {
        Self { streams, guards, answer, space_id: None, then: None, unwritten: None }
    }

    /// One stream change answered with `status` and `body`.
    pub fn one(stream: StreamAppend, guards: Vec<Guard>, status: StatusCode, body: Value) -> Self {
        Self::new(vec![stream], guards, Answer::json(status, body))
    }

    /// The space a public command writes in.
    pub fn in_space(mut self, space_id: &str) -> Self {
        self.space_id = Some(space_id.to_owned());
        self
    }

    pub fn then(mut self, then: Then) -> Self {
        self.then = Some(then);
        self
    }

    /// `hook` runs when the append is refused for certain: anything but an unknown outcome.
    pub fn if_unwritten(mut self, hook: impl FnOnce() + Send + 'static) -> Self {
        self.unwritten = Some(Box::new(hook));
        self
    }
}

/// A command's answer, rendered.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Rendered,
}

/// An answer's body as it goes out.
#[derive(Debug, Clone, PartialEq)]
pub enum Rendered {
    Json(Value),
    Html(String),
}

impl Answer {
    pub fn json(status: StatusCode, body: Value) -> Self {
        Self { status, body: Rendered::Json(body) }
    }

    pub fn html(status: StatusCode, page: String) -> Self {
        Self { status, body: Rendered::Html(page) }
    }
}

/// What a refused append means.
pub enum Refusal {
    /// The decision was made on state that changed: decide again.
    Again,
    /// The answer.
    Fail(ApiError),
    /// Answer this instead (a refusal that is a success, such as a link followed twice).
    Answer(Answer),
}

impl Refusal {
    /// A stream not at its loaded version, a moved catalog or a moved authored resource is a
    /// lost race; anything else is the contract's answer to the failed append.
    pub(crate) fn default_for(error: AppendError) -> Self {
        match error {
            AppendError::WrongVersion { .. } => Self::Again,
            AppendError::Conflict { code: Code::CatalogMoved | Code::StreamMoved, .. } => Self::Again,
            error => Self::Fail(error.into()),
        }
    }
}

/// What a command reads through: fresh state only.
pub struct Ctx<'a> {
    pub state: &'a State,
    pub req: &'a HttpRequest,
    actor: &'a Actor<'a>,
    /// The catalog revision the first catalog read of this attempt saw.
    catalog_revision: Cell<Option<i64>>,
    /// Whether a catalog context came from the process cache (see [`Ctx::kept_catalog`]).
    kept: Cell<bool>,
    /// Two catalog reads of one attempt saw different revisions: decide again.
    torn: Cell<bool>,
    /// The live catalog schema, once read.
    catalog_schema: RefCell<Option<String>>,
    attempt: usize,
}

impl<'a> Ctx<'a> {
    fn new(state: &'a State, req: &'a HttpRequest, actor: &'a Actor<'a>, attempt: usize) -> Self {
        Self {
            state,
            req,
            actor,
            catalog_revision: Cell::new(None),
            kept: Cell::new(false),
            torn: Cell::new(false),
            catalog_schema: RefCell::new(None),
            attempt,
        }
    }

    /// The attempt this is (0 for the first).
    pub fn attempt(&self) -> usize {
        self.attempt
    }

    /// The calling key, for a command run by one.
    pub fn caller(&self) -> Result<&'a Caller, ApiError> {
        match self.actor {
            Actor::Key(caller) => Ok(caller),
            Actor::Public | Actor::WriteKey { .. } => {
                Err(ApiError::internal(&anyhow::anyhow!("a command without an API key asked for its caller")))
            }
        }
    }

    /// A connection for reading the log and the write side's guard tables, which the append
    /// transactions write themselves (so what they hold is as new as every acknowledged write).
    pub async fn db(&self) -> Result<deadpool_postgres::Client, ApiError> {
        Ok(self.state.pool.get().await?)
    }

    /// The schema of the live catalog read model, for reading authored data. The catalog's
    /// revision is read first and guards the append (`catalog::revision_guard`): if any
    /// catalog event is applied before the append, the command is decided again. The
    /// operator's apply returns only once the catalog holds what it wrote, so an acknowledged
    /// authoring change is never missed.
    pub async fn catalog(&self) -> Result<String, ApiError> {
        if let Some(schema) = self.catalog_schema.borrow().clone() {
            return Ok(schema);
        }
        let client = self.db().await?;
        let statement = client
            .prepare_cached("SELECT version, revision FROM projections WHERE name = 'catalog' AND status = 'live'")
            .await?;
        let row = client
            .query_opt(&statement, &[])
            .await?
            .ok_or_else(|| ApiError::unavailable("the catalog is not built yet; retry shortly"))?;
        let schema = platform::readmodel::schema_name(CATALOG, row.get(0));
        self.saw_catalog(row.get(1));
        *self.catalog_schema.borrow_mut() = Some(schema.clone());
        Ok(schema)
    }

    /// The schema of the live catalog as this process last saw it, with no statement: for a
    /// read that returns the catalog's revision itself and hands it to [`Ctx::saw_catalog`].
    pub(crate) async fn catalog_as_last_seen(&self) -> Result<String, ApiError> {
        if let Some(schema) = self.catalog_schema.borrow().clone() {
            return Ok(schema);
        }
        Ok(self.state.read_models.current(&[CATALOG]).await?.schema(CATALOG))
    }

    /// Records a catalog revision that a read saw (in the same statement as its data).
    pub(crate) fn saw_catalog(&self, revision: i64) {
        match self.catalog_revision.get() {
            None => self.catalog_revision.set(Some(revision)),
            Some(seen) if seen == revision => {}
            Some(_) => self.torn.set(true),
        }
    }

    /// The catalog revision this attempt's reads saw, if any.
    pub(crate) fn catalog_revision_seen(&self) -> Option<i64> {
        self.catalog_revision.get()
    }

    /// Whether a catalog context of this attempt came from this process's cache.
    pub fn kept(&self) -> bool {
        self.kept.get()
    }

    /// Records that a catalog context came from this process's cache at `revision`: its
    /// append is guarded by that revision, and a refusal decided on it is decided again on a
    /// fresh read if the catalog has moved on (the cache may be what refused).
    pub(crate) fn kept_catalog(&self, revision: i64) {
        self.saw_catalog(revision);
        self.kept.set(true);
    }
}

/// The schema of the live catalog for a check at the edge, before any claim (an unknown
/// resource records nothing); a command's own reads go through [`Ctx`].
pub(crate) async fn edge_catalog(state: &State) -> Result<String, ApiError> {
    Ok(state.read_models.current(&[CATALOG]).await?.schema(CATALOG))
}

/// The id of the space's authored resource of `kind` (a broadcast, a workflow) that a path
/// names by its id or its slug (an id wins); the path's text itself when none matches, so the
/// command answers its own 404.
pub(crate) async fn authored_id(
    state: &State,
    (kind, space_id): (&str, &str),
    id_or_slug: String,
) -> Result<String, ApiError> {
    let catalog = edge_catalog(state).await?;
    let client = state.pool.get().await?;
    Ok(reads::catalog::resource_id_of(&client, &catalog, (kind, space_id), &id_or_slug).await?.unwrap_or(id_or_slug))
}

/// Authenticates and authorizes a command (`permission`, in the request's bucket).
pub async fn authorize(req: &HttpRequest, state: &State, permission: Permission) -> Result<Caller, ApiError> {
    state.authenticator.authorize(req, permission).await
}

/// Reads the JSON object body and authorizes in `bucket` (chosen by the handler, perhaps from
/// the body): a missing or bad key is answered before a bad body.
pub(crate) async fn authorize_with_body(
    req: &HttpRequest,
    payload: web::Payload,
    state: &State,
    permission: Permission,
    bucket: impl FnOnce(Result<&Map<String, Value>, &ApiError>) -> Bucket,
) -> Result<(Caller, Map<String, Value>), ApiError> {
    let body = api::http::read_json_object(req, payload).await;
    let bucket = bucket(body.as_ref());
    let caller = state.authenticator.authorize_in(req, permission, bucket).await?;
    Ok((caller, body?))
}

/// The request's bucket, whatever the body (most commands).
pub(crate) fn request_bucket(req: &HttpRequest) -> impl FnOnce(Result<&Map<String, Value>, &ApiError>) -> Bucket + '_ {
    move |_| Bucket::for_request(req)
}

/// Runs `command`: admits it (or answers a replay), then loads, decides and appends it, again
/// when its append lost a race, and answers.
pub async fn execute<C: Command>(
    state: &web::Data<State>,
    req: &HttpRequest,
    actor: Actor<'_>,
    protection: Protection<'_>,
    command: C,
) -> Result<HttpResponse, ApiError> {
    let (claim, operation_id) = match (&protection, &actor) {
        (Protection::Keyed(body), Actor::Key(caller)) => match idempotency::admit(state, req, caller, body).await? {
            Admission::Replay(response) => return Ok(response),
            Admission::Claimed(claim) => {
                let operation_id = claim.operation_id.clone();
                (Some(claim), operation_id)
            }
            Admission::Unprotected { operation_id } => (None, operation_id),
        },
        _ => (None, platform::ids::new_id("op")),
    };
    let outcome = attempts(state, req, &actor, claim.as_ref(), &operation_id, &command).await;
    let public = !matches!(actor, Actor::Key(_));
    let outcome =
        outcome.map(|(answer, appended)| respond(&answer, (!public).then_some(operation_id.as_str()), appended));
    match actor {
        Actor::Key(_) => {
            let unconfirmed = outcome.as_ref().err().is_some_and(ApiError::is_unconfirmed);
            idempotency::finish(state, claim.as_ref(), &operation_id, outcome, unconfirmed).await
        }
        // A public answer carries no Operation-Id: nobody can reconcile with it.
        Actor::Public | Actor::WriteKey { .. } => outcome,
    }
}

/// Runs `command` without idempotency (as [`execute`] runs an unkeyed one) and gives its
/// answer as data, with where its append landed: for a caller that answers for many commands
/// at once (the ingest's messages).
pub(crate) async fn run<C: Command>(
    state: &web::Data<State>,
    req: &HttpRequest,
    actor: Actor<'_>,
    command: C,
) -> Result<(Answer, Option<Appended>), ApiError> {
    let operation_id = platform::ids::new_id("op");
    attempts(state, req, &actor, None, &operation_id, &command).await
}

async fn attempts<C: Command>(
    state: &web::Data<State>,
    req: &HttpRequest,
    actor: &Actor<'_>,
    claim: Option<&Claim>,
    operation_id: &str,
    command: &C,
) -> Result<(Answer, Option<Appended>), ApiError> {
    for attempt in 0..command.attempts().max(1) {
        let ctx = Ctx::new(state, req, actor, attempt);
        let decided = match command.load(&ctx).await {
            Ok(loaded) => {
                let mut fresh = Drawn;
                let mut given = Given { now_ms: platform::time::now_millis(), operation_id, fresh: &mut fresh };
                match command.decide(loaded, &mut given) {
                    Ok(outcome) => command.answer(outcome, &Shell { operation_id, claim, state }),
                    Err(refusal) => Err(refusal.into()),
                }
            }
            Err(error) => Err(error),
        };
        if ctx.torn.get() {
            // The attempt's reads saw two catalog revisions: a context kept from an older
            // revision met a fresh read. Drop what is kept from other revisions than the live
            // one, or every attempt would meet the same stale entry.
            keep_only(ctx.state, live_catalog_revision(&ctx).await?);
            continue;
        }
        let decision = match decided {
            Ok(Decided::Append(decision)) => decision,
            Ok(Decided::Again) => continue,
            Ok(Decided::Answer(answer)) => {
                if let (Some(claim), Rendered::Json(body)) = (claim, &answer.body) {
                    claim.record(state, answer.status, body).await?;
                }
                return Ok((answer, None));
            }
            Err(error) if ctx.kept.get() && error.status().is_client_error() => {
                if catalog_moved(&ctx).await? {
                    continue;
                }
                return Err(error);
            }
            Err(error) => return Err(error),
        };
        let Decision { streams, mut guards, answer, space_id, then, unwritten } = decision;
        guards.extend(ctx.catalog_revision.get().map(domain::catalog::revision_guard));
        if claim.is_some() && matches!(then, Some(Then::Answer(_))) {
            return Err(ApiError::internal(&anyhow::anyhow!("an idempotent command's answer follows its append")));
        }
        let effect_completes = matches!(then, Some(Then::Finish(_)));
        match (claim, effect_completes) {
            (Some(claim), false) => match &answer.body {
                Rendered::Json(body) => guards.push(claim.completion(answer.status, body)),
                Rendered::Html(_) => {
                    return Err(ApiError::internal(&anyhow::anyhow!("an idempotent command answered a page")));
                }
            },
            // The effect records the answer (a send's hand-off); the append holds the claim.
            (Some(claim), true) => guards.push(claim.held()),
            (None, _) => {}
        }
        let metadata = match actor {
            Actor::Key(caller) => crate::edge::metadata(req, caller, claim.map(|claim| claim.key.clone())),
            Actor::Public => Metadata { space_id, ..Metadata::default() },
            Actor::WriteKey { space_id, write_key_id } => Metadata {
                space_id: Some((*space_id).to_owned()),
                actor_key_id: Some((*write_key_id).to_owned()),
                request_id: Some(api::http::request_id(req)),
                ..Metadata::default()
            },
        };
        let appended = state.event_log.append(AppendRequest::new(metadata, streams, guards)).await;
        let appended = match appended {
            Ok(appended) => appended,
            Err(error) => {
                // The log's errors other than an unknown outcome are refusals: nothing written.
                if !matches!(error, AppendError::OutcomeUnknown(_))
                    && let Some(unwritten) = unwritten
                {
                    unwritten();
                }
                match command.refused(error) {
                    Refusal::Again => {
                        if ctx.kept.get() {
                            catalog_moved(&ctx).await?;
                        }
                        continue;
                    }
                    // A guard's refusal (an allowance used up, say) decided on a kept context
                    // may be the cache's: decided again on a fresh read if the catalog moved.
                    Refusal::Fail(error) if ctx.kept.get() && error.status().is_client_error() => {
                        if catalog_moved(&ctx).await? {
                            continue;
                        }
                        return Err(error);
                    }
                    Refusal::Fail(error) => return Err(error),
                    Refusal::Answer(answer) => return Ok((answer, None)),
                }
            }
        };
        return match then {
            None => Ok((answer, Some(appended))),
            Some(Then::Answer(answer)) => Ok((answer(appended), Some(appended))),
            Some(Then::Detach(effect)) => {
                tokio::spawn(effect(state.clone()));
                Ok((answer, Some(appended)))
            }
            Some(Then::Finish(effect)) => {
                let (answer, recorded) = effect(state.clone()).await?;
                // The token covers the effect's outcome too (a bounce's suppression, for one).
                Ok((answer, Some(recorded.max(appended))))
            }
        };
    }
    Err(command.lost_too_often())
}

/// Whether the catalog moved on since a kept context was read; if it did, this process's
/// kept contexts of older revisions are dropped, so the next attempt reads afresh.
async fn catalog_moved(ctx: &Ctx<'_>) -> Result<bool, ApiError> {
    let Some(seen) = ctx.catalog_revision.get() else { return Ok(false) };
    let current = live_catalog_revision(ctx).await?;
    if current == seen {
        return Ok(false);
    }
    keep_only(ctx.state, current);
    Ok(true)
}

/// The live catalog's revision, read now.
async fn live_catalog_revision(ctx: &Ctx<'_>) -> Result<i64, ApiError> {
    let client = ctx.db().await?;
    let statement =
        client.prepare_cached("SELECT revision FROM projections WHERE name = 'catalog' AND status = 'live'").await?;
    Ok(client.query_opt(&statement, &[]).await?.map_or(0, |row| row.get(0)))
}

/// Drops this process's kept contexts read at another catalog revision than `current`.
fn keep_only(state: &State, current: i64) {
    for kept in state.kept() {
        kept.keep_revision(current);
    }
}

/// An answer with `Operation-Id` (for a key's command) and `Consistency-Token` when something
/// was appended.
pub fn respond(answer: &Answer, operation_id: Option<&str>, appended: Option<Appended>) -> HttpResponse {
    let mut response = HttpResponse::build(answer.status);
    if let Some(operation_id) = operation_id {
        response.insert_header(("Operation-Id", operation_id.to_owned()));
    }
    crate::edge::consistency_token(&mut response, appended);
    match &answer.body {
        Rendered::Json(body) => response.json(body),
        Rendered::Html(page) => api::pages::page_headers(&mut response).body(page.clone()),
    }
}
