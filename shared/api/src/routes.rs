//! The API's operations: each method and path of the contract that is built, with the tier
//! that serves it. This table is the one list of the HTTP surface: both services build their
//! routers from it, every service answers 405 (with `Allow`) for a known path with another
//! method and 404 for an unknown path (so the split deployment behaves like a single node),
//! request metrics are labelled by its operation ids, and a test holds `docs/openapi.json` to
//! exactly these operations.

use std::sync::LazyLock;

use actix_web::HttpMessage;

/// Which process serves an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Writes: the command service.
    Command,
    /// Reads: the query service.
    Query,
    /// A guard of the contract that exists only to answer 405, on every service.
    Guard,
}

/// One operation of the API: `path` is under the `/v1` prefix; `id` is its OpenAPI
/// `operationId`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    pub id: &'static str,
    pub method: &'static str,
    pub path: &'static str,
    pub tier: Tier,
}

const fn operation(id: &'static str, method: &'static str, path: &'static str, tier: Tier) -> Operation {
    Operation { id, method, path, tier }
}

use Tier::{Command, Guard, Query};

/// Every operation built, in the order of the contract.
pub const OPERATIONS: &[Operation] = &[
    operation("getMe", "GET", "/me", Query),
    operation("getOpenApi", "GET", "/openapi.json", Query),
    operation("listSchemas", "GET", "/schemas", Query),
    operation("getSchema", "GET", "/schemas/{schema}", Query),
    operation("listAttributes", "GET", "/schemas/{schema}/attributes", Query),
    operation("listRecords", "GET", "/schemas/{schema}/records", Query),
    operation("createRecord", "POST", "/schemas/{schema}/records", Command),
    operation("upsertRecord", "POST", "/schemas/{schema}/records/upsert", Command),
    operation("getRecord", "GET", "/schemas/{schema}/records/{id}", Query),
    operation("updateRecord", "PATCH", "/schemas/{schema}/records/{id}", Command),
    operation("deleteRecord", "DELETE", "/schemas/{schema}/records/{id}", Command),
    operation("getRecordAuditTrail", "GET", "/schemas/{schema}/records/{id}/audit-trail", Query),
    operation("getRecordDeletion", "GET", "/record-deletions/{operationId}", Query),
    // Bulk imports (not in the contract; see docs/decisions.md).
    operation("listImports", "GET", "/imports", Query),
    operation("createImport", "PUT", "/imports/{importId}", Command),
    operation("deleteImport", "DELETE", "/imports/{importId}", Command),
    operation("getImport", "GET", "/imports/{importId}", Query),
    operation("putImportPart", "PUT", "/imports/{importId}/parts/{part}", Command),
    operation("completeImport", "POST", "/imports/{importId}/complete", Command),
    operation("listImportRows", "GET", "/imports/{importId}/rows", Query),
    operation("listSuppressions", "GET", "/contacts/suppressions", Query),
    operation("createSuppression", "POST", "/contacts/suppressions", Command),
    operation("batchCreateSuppressions", "POST", "/contacts/suppressions/batch", Command),
    operation("batchRemoveSuppressions", "POST", "/contacts/suppressions/batch-remove", Command),
    operation("deleteSuppression", "DELETE", "/contacts/suppressions/{id}", Command),
    operation("listEvents", "GET", "/events", Query),
    operation("fireEvent", "POST", "/events/{schema}", Command),
    // The contract's `PATCH` and `DELETE /events/{id}`: events are immutable.
    operation("patchEventNotAllowed", "PATCH", "/events/{schema}", Guard),
    operation("deleteEventNotAllowed", "DELETE", "/events/{schema}", Guard),
    operation("fireEventBatch", "POST", "/events/{schema}/batch", Command),
    operation("getEventStatus", "GET", "/events/{schema}/{id}/status", Query),
    operation("changeEventIdentity", "POST", "/event-identities", Command),
    operation("listWebhooks", "GET", "/webhooks", Query),
    operation("createWebhook", "POST", "/webhooks", Command),
    operation("getWebhook", "GET", "/webhooks/{id}", Query),
    operation("updateWebhook", "PATCH", "/webhooks/{id}", Command),
    operation("deleteWebhook", "DELETE", "/webhooks/{id}", Command),
    operation("rotateWebhookSecret", "POST", "/webhooks/{id}/rotate-secret", Command),
    operation("listWebhookDeliveries", "GET", "/webhooks/{id}/deliveries", Query),
    operation("replayWebhookDelivery", "POST", "/webhooks/{id}/deliveries/{deliveryId}/replay", Command),
    operation("testWebhook", "POST", "/webhooks/{id}/test", Command),
    operation("listTemplates", "GET", "/templates", Query),
    operation("getTemplate", "GET", "/templates/{id}", Query),
    operation("sendTemplate", "POST", "/templates/{id}/send", Command),
    operation("previewTemplate", "POST", "/templates/{id}/preview", Command),
    operation("testTemplate", "POST", "/templates/{id}/test", Command),
    operation("listDomains", "GET", "/domains", Query),
    operation("getDomain", "GET", "/domains/{id}", Query),
    operation("listSenders", "GET", "/senders", Query),
    operation("getSender", "GET", "/senders/{id}", Query),
    operation("listTopics", "GET", "/topics", Query),
    operation("getTopic", "GET", "/topics/{id}", Query),
    operation("listEmails", "GET", "/emails", Query),
    operation("getEmail", "GET", "/emails/{id}", Query),
    operation("unsubscribeEmail", "POST", "/emails/{id}/unsubscribe", Command),
    operation("getUnsubscribePage", "GET", "/emails/{id}/unsubscribe", Query),
    // The preference page's choices (the page behind the unsubscribe link).
    operation("updateEmailPreferences", "POST", "/emails/{id}/preferences", Command),
    // Tracking links inside emails: GETs that write (each is a click or an open); the split
    // deployment's nginx sends them to the command service.
    operation("followEmailLink", "GET", "/emails/{id}/click", Command),
    operation("fetchEmailOpenPixel", "GET", "/emails/{id}/open", Command),
    operation("submitForm", "POST", "/forms/{id}/submit", Command),
    // The space's forms (read permission), to learn a form's id and its public URLs.
    operation("listForms", "GET", "/forms", Query),
    operation("getForm", "GET", "/forms/{id}", Query),
    // A GET that writes (D7): the split deployment's nginx sends `/v1/forms/{id}/confirm/` to
    // the command service.
    operation("confirmFormSubmission", "GET", "/forms/{id}/confirm/{token}", Command),
    operation("listSegments", "GET", "/segments", Query),
    operation("createSegment", "POST", "/segments", Command),
    operation("getSegment", "GET", "/segments/{id}", Query),
    operation("deleteSegment", "DELETE", "/segments/{id}", Command),
    operation("listSegmentContacts", "GET", "/segments/{id}/contacts", Query),
    operation("listBroadcasts", "GET", "/broadcasts", Query),
    operation("getBroadcast", "GET", "/broadcasts/{id}", Query),
    operation("updateBroadcast", "PATCH", "/broadcasts/{id}", Command),
    operation("sendBroadcast", "POST", "/broadcasts/{id}/send", Command),
    operation("listBroadcastRuns", "GET", "/broadcasts/{id}/runs", Query),
    operation("getBroadcastRun", "GET", "/broadcasts/{id}/runs/{runId}", Query),
    operation("listBroadcastRunLinks", "GET", "/broadcasts/{id}/runs/{runId}/links", Query),
    operation("listWorkflows", "GET", "/workflows", Query),
    operation("getWorkflow", "GET", "/workflows/{id}", Query),
    operation("getWorkflowStats", "GET", "/workflows/{id}/stats", Query),
    operation("listWorkflowRevisions", "GET", "/workflows/{id}/revisions", Query),
    // `{id}` is the reference id of the workflow's incoming-webhook step (D10).
    operation("triggerWorkflow", "POST", "/workflows/{id}", Command),
    operation("pauseWorkflow", "POST", "/workflows/{id}/pause", Command),
    operation("unpauseWorkflow", "POST", "/workflows/{id}/unpause", Command),
    operation("listWorkflowRuns", "GET", "/workflows/{id}/runs", Query),
    operation("getWorkflowRun", "GET", "/workflows/{id}/runs/{runId}", Query),
    operation("requestWorkflowReplay", "POST", "/workflows/{id}/replays", Command),
    operation("getWorkflowReplay", "GET", "/workflows/{id}/replays/{replayId}", Query),
    // The Segment HTTP Tracking API (not in the contract; docs/decisions.md, Ingest), with a
    // write key instead of an API key.
    operation("ingestBatch", "POST", "/batch", Command),
    operation("ingestIdentify", "POST", "/identify", Command),
    operation("ingestTrack", "POST", "/track", Command),
    operation("ingestPage", "POST", "/page", Command),
    operation("ingestScreen", "POST", "/screen", Command),
    operation("ingestGroup", "POST", "/group", Command),
    operation("ingestAlias", "POST", "/alias", Command),
    operation("listIngestFailures", "GET", "/ingest-failures", Query),
];

/// The API prefix every path lives under.
pub(crate) const API_PREFIX: &str = "/v1";

/// The operations a tier serves.
pub fn of_tier(tier: Tier) -> impl Iterator<Item = &'static Operation> {
    OPERATIONS.iter().filter(move |operation| operation.tier == tier)
}

/// The path of a request under the prefix, without a trailing slash; `None` outside it.
fn api_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix(API_PREFIX)?;
    Some(rest.strip_suffix('/').filter(|rest| !rest.is_empty()).unwrap_or(rest))
}

/// A template split into its segments once: a literal segment, or `None` for a parameter.
struct Compiled {
    template: &'static str,
    parts: Vec<Option<&'static str>>,
}

/// The most segments a path under the prefix has (the empty one before its first `/`
/// included); a longer path fits no template.
const MAX_SEGMENTS: usize = 8;

/// The distinct path templates, literal segments first: `/records/upsert` is tried before
/// `/records/{id}`. Built once; matching is a segment comparison, no pattern compiling.
static TEMPLATES: LazyLock<Vec<Compiled>> = LazyLock::new(|| {
    let mut templates: Vec<&'static str> = Vec::new();
    for operation in OPERATIONS {
        if !templates.contains(&operation.path) {
            templates.push(operation.path);
        }
    }
    templates.sort_by_key(|template| std::cmp::Reverse(template.split('/').filter(|part| !is_parameter(part)).count()));
    templates.into_iter().map(|template| Compiled { template, parts: compile(template) }).collect()
});

fn compile(template: &str) -> Vec<Option<&str>> {
    template.split('/').map(|part| (!is_parameter(part)).then_some(part)).collect()
}

fn is_parameter(part: &str) -> bool {
    part.starts_with('{') && part.ends_with('}')
}

/// Whether a path's segments fit a template's: as many, each literal equal and each
/// parameter non-empty.
fn fits_parts(parts: &[Option<&str>], segments: &[&str]) -> bool {
    parts.len() == segments.len()
        && parts.iter().zip(segments).all(|(part, segment)| match part {
            Some(literal) => literal == segment,
            None => !segment.is_empty(),
        })
}

/// Whether a path (under the prefix) fits a template.
#[cfg(test)]
fn fits(template: &str, rest: &str) -> bool {
    let segments: Vec<&str> = rest.split('/').collect();
    fits_parts(&compile(template), &segments)
}

/// The path template a request path (with the `/v1` prefix) matches, if any. The path is
/// split once, on the stack.
pub fn template(path: &str) -> Option<&'static str> {
    let rest = api_path(path)?;
    let mut segments = [""; MAX_SEGMENTS];
    let mut count = 0;
    for segment in rest.split('/') {
        *segments.get_mut(count)? = segment;
        count += 1;
    }
    let segments = &segments[..count];
    TEMPLATES.iter().find(|compiled| fits_parts(&compiled.parts, segments)).map(|compiled| compiled.template)
}

/// The operation a request (method, path with the `/v1` prefix) addresses, if any.
pub fn find(method: &str, path: &str) -> Option<&'static Operation> {
    let template = template(path)?;
    OPERATIONS.iter().find(|operation| operation.path == template && operation.method == method)
}

/// The methods of a known request path, for `Allow` on a 405: every method the OpenAPI
/// document lists for its template, the guards' included. The contract defines `PATCH` and
/// `DELETE` on `/events/{schema}` as operations (whose answer is always 405), so the document
/// lists them and `Allow` names them too: a client, or a checker, comparing the two sees one
/// set of methods (RFC 9110 §10.2.1: `Allow` advertises the target's methods).
pub(crate) fn allowed_methods(path: &str) -> Option<Vec<&'static str>> {
    let template = template(path)?;
    Some(OPERATIONS.iter().filter(|operation| operation.path == template).map(|operation| operation.method).collect())
}

/// Whether a handler serves an operation: every one but a guard.
pub(crate) fn serves(operation: &Operation) -> bool {
    operation.tier != Tier::Guard
}

/// The operation a request addresses, looked up once per request: the first middleware
/// that asks ([`addressed`]) keeps the answer in the request's extensions.
#[derive(Debug, Clone, Copy)]
struct Addressed(Option<&'static Operation>);

/// The operation a request addresses, if any (see [`find`]), looked up once per request.
pub(crate) fn addressed(req: &actix_web::dev::ServiceRequest) -> Option<&'static Operation> {
    if let Some(Addressed(operation)) = req.extensions().get::<Addressed>() {
        return *operation;
    }
    let operation = find(req.method().as_str(), req.path());
    req.extensions_mut().insert(Addressed(operation));
    operation
}

/// The named parameters of a request path (with the `/v1` prefix) that fits `template`, as
/// sent, still percent-encoded: `[("schema", "contacts"), ("id", "con_1")]`.
pub(crate) fn parameters_of<'a>(template: &'static str, path: &'a str) -> Vec<(&'static str, &'a str)> {
    let Some(rest) = api_path(path) else { return Vec::new() };
    template
        .split('/')
        .zip(rest.split('/'))
        .filter_map(|(part, segment)| {
            part.strip_prefix('{').and_then(|name| name.strip_suffix('}')).map(|name| (name, segment))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_paths_match_templates_and_literals_win() {
        assert!(template("/v1/me").is_some());
        assert!(template("/v1/events/ev_123").is_some());
        assert!(template("/v1/nothing").is_none());
        assert!(template("/me").is_none());
        assert_eq!(template("/v1/schemas/contacts/records/upsert"), Some("/schemas/{schema}/records/upsert"));
        assert_eq!(template("/v1/schemas/contacts/records/con_1"), Some("/schemas/{schema}/records/{id}"));
        assert_eq!(find("POST", "/v1/schemas/contacts/records/upsert").map(|o| o.id), Some("upsertRecord"));
        assert_eq!(find("PUT", "/v1/me"), None);
    }

    #[test]
    fn segment_matching_agrees_with_the_router() {
        // Each template filled with parameter values, plus near misses: an empty segment, a
        // segment too many or too few, an encoded slash.
        let mut probes: Vec<String> = Vec::new();
        for template in TEMPLATES.iter().map(|compiled| compiled.template) {
            let filled = template.split('/').map(|part| if is_parameter(part) { "x_1" } else { part });
            let filled: Vec<&str> = filled.collect();
            probes.push(filled.join("/"));
            probes.push(format!("{}/extra", filled.join("/")));
            probes.push(filled[..filled.len() - 1].join("/"));
            probes.push(template.replace("{", "").replace("}", ""));
            probes.push(
                template
                    .split('/')
                    .map(|part| if is_parameter(part) { "" } else { part })
                    .collect::<Vec<_>>()
                    .join("/"),
            );
            probes.push(
                template
                    .split('/')
                    .map(|part| if is_parameter(part) { "a%2Fb" } else { part })
                    .collect::<Vec<_>>()
                    .join("/"),
            );
        }
        for template in TEMPLATES.iter().map(|compiled| compiled.template) {
            let router = actix_web::dev::ResourceDef::new(template);
            for probe in &probes {
                assert_eq!(fits(template, probe), router.is_match(probe), "{template} against {probe}");
            }
        }
        // The lookup on the stack agrees with the templates one by one.
        for probe in &probes {
            let path = format!("{API_PREFIX}{probe}");
            let expected = TEMPLATES
                .iter()
                .map(|compiled| compiled.template)
                .find(|template| api_path(&path).is_some_and(|rest| fits(template, rest)));
            assert_eq!(template(&path), expected, "{probe}");
        }
        assert_eq!(template("/v1/a/b/c/d/e/f/g/h/i"), None, "longer than any template");
        assert!(TEMPLATES.iter().all(|compiled| compiled.parts.len() <= MAX_SEGMENTS));
    }

    #[test]
    fn path_parameters_are_named_by_the_template() {
        let path_parameters = |path| template(path).map(|template| parameters_of(template, path)).unwrap_or_default();
        assert_eq!(
            path_parameters("/v1/schemas/contacts/records/con_%00"),
            [("schema", "contacts"), ("id", "con_%00")]
        );
        assert_eq!(path_parameters("/v1/record-deletions/op_1/"), [("operationId", "op_1")]);
        assert!(path_parameters("/v1/me").is_empty());
        assert!(path_parameters("/v1/nothing/here").is_empty());
    }

    #[test]
    fn methods_guards_and_served_operations() {
        assert_eq!(allowed_methods("/v1/schemas/contacts/records"), Some(vec!["GET", "POST"]));
        assert_eq!(
            allowed_methods("/v1/events/ev_1"),
            Some(vec!["POST", "PATCH", "DELETE"]),
            "the guards' methods are listed, as the document lists them"
        );
        assert_eq!(allowed_methods("/v1/nothing"), None);
        let is_served = |method, path| find(method, path).is_some_and(serves);
        assert!(is_served("POST", "/v1/events/order-placed"));
        assert!(!is_served("PATCH", "/v1/events/ev_1"), "a guard");
        assert!(!is_served("PUT", "/v1/me"));
    }

    #[test]
    fn operation_ids_and_method_path_pairs_are_unique() {
        for (index, operation) in OPERATIONS.iter().enumerate() {
            for other in &OPERATIONS[index + 1..] {
                assert_ne!(operation.id, other.id);
                assert!((operation.method, operation.path) != (other.method, other.path), "{operation:?}");
            }
        }
    }
}
