//! The API's route table: every path of the contract (decision D1) with the methods it has.
//! Both services answer 405 for a known path with another method and 404 for unknown paths,
//! whichever service a request lands on, so the split deployment behaves like a single node.

use actix_web::dev::ResourceDef;

/// `(path under /v1, methods)`. A path with no methods exists only to answer 405.
pub const API_ROUTES: &[(&str, &[&str])] = &[
    ("/me", &["GET"]),
    ("/openapi.json", &["GET"]),
    ("/schemas", &["GET"]),
    ("/schemas/{schema}", &["GET"]),
    ("/schemas/{schema}/attributes", &["GET"]),
    ("/schemas/{schema}/records", &["GET", "POST"]),
    ("/schemas/{schema}/records/upsert", &["POST"]),
    ("/schemas/{schema}/records/{id}", &["GET", "PATCH", "DELETE"]),
    ("/schemas/{schema}/records/{id}/audit-trail", &["GET"]),
    ("/record-deletions/{operationId}", &["GET"]),
    ("/contacts/suppressions", &["GET", "POST"]),
    ("/contacts/suppressions/batch", &["POST"]),
    ("/contacts/suppressions/batch-remove", &["POST"]),
    ("/contacts/suppressions/{id}", &["DELETE"]),
    ("/events", &["GET"]),
    // PATCH and DELETE here are the contract's guards (`/events/{id}`): they exist only to
    // answer 405, every time (see [`GUARDS`]).
    ("/events/{schema}", &["POST", "PATCH", "DELETE"]),
    ("/events/{schema}/batch", &["POST"]),
    ("/events/{schema}/{id}/status", &["GET"]),
    ("/event-identities", &["POST"]),
    ("/webhooks", &["GET", "POST"]),
    ("/webhooks/{id}", &["GET", "PATCH", "DELETE"]),
    ("/webhooks/{id}/rotate-secret", &["POST"]),
    ("/templates", &["GET"]),
    ("/templates/{id}", &["GET"]),
    ("/templates/{templateId}/send", &["POST"]),
    ("/segments", &["GET", "POST"]),
    ("/segments/{id}", &["GET", "DELETE"]),
    ("/segments/{id}/contacts", &["GET"]),
    ("/broadcasts", &["GET"]),
    ("/broadcasts/{id}", &["GET", "PATCH"]),
    ("/broadcasts/{id}/send", &["POST"]),
    ("/broadcasts/{id}/runs", &["GET"]),
    ("/broadcasts/{id}/runs/{runId}", &["GET"]),
    ("/workflows", &["GET"]),
    ("/workflows/{id}", &["GET", "POST"]),
    ("/workflows/{id}/pause", &["POST"]),
    ("/workflows/{id}/unpause", &["POST"]),
    ("/workflows/{id}/runs", &["GET"]),
    ("/workflows/{id}/runs/{runId}", &["GET"]),
    ("/domains", &["GET"]),
    ("/domains/{id}", &["GET"]),
    ("/senders", &["GET"]),
    ("/senders/{id}", &["GET"]),
    ("/topics", &["GET"]),
    ("/topics/{id}", &["GET"]),
    ("/forms/{formId}/submit", &["POST"]),
    ("/forms/{formId}/confirm/{token}", &["GET"]),
    ("/emails/{emailId}/unsubscribe", &["POST"]),
];

/// Operations that exist only to answer 405 (`PATCH` and `DELETE /events/{id}`: events are
/// immutable). No handler serves them; the fallback answers, with `Allow`.
pub const GUARDS: &[(&str, &str)] = &[("PATCH", "/events/{schema}"), ("DELETE", "/events/{schema}")];

/// Whether a request would be served by a handler: its path is known, the path offers its
/// method, and the operation is not a guard.
pub fn is_served(method: &str, path: &str) -> bool {
    let Some(rest) = path.strip_prefix(API_PREFIX) else { return false };
    let rest = rest.strip_suffix('/').filter(|r| !r.is_empty()).unwrap_or(rest);
    API_ROUTES.iter().find(|(pattern, _)| ResourceDef::new(*pattern).is_match(rest)).is_some_and(
        |(pattern, methods)| {
            methods.contains(&method)
                && !GUARDS.iter().any(|(guard_method, guard)| *guard_method == method && guard == pattern)
        },
    )
}

/// The API prefix every path lives under.
pub const API_PREFIX: &str = "/v1";

/// Whether a request path (with the `/v1` prefix) names a path of the API.
pub fn is_known_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix(API_PREFIX) else {
        return false;
    };
    let rest = rest.strip_suffix('/').filter(|r| !r.is_empty()).unwrap_or(rest);
    API_ROUTES.iter().any(|(pattern, _)| ResourceDef::new(*pattern).is_match(rest))
}

/// The methods a known request path (with the `/v1` prefix) allows, for `Allow` on a 405.
pub fn allowed_methods(path: &str) -> Option<&'static [&'static str]> {
    let rest = path.strip_prefix(API_PREFIX)?;
    let rest = rest.strip_suffix('/').filter(|r| !r.is_empty()).unwrap_or(rest);
    API_ROUTES.iter().find(|(pattern, _)| ResourceDef::new(*pattern).is_match(rest)).map(|(_, methods)| *methods)
}

/// The named parameters of a request path (with the `/v1` prefix) as sent, still
/// percent-encoded: `[("schema", "contacts"), ("id", "con_1")]`. Empty for unknown paths.
pub fn path_parameters(path: &str) -> Vec<(&'static str, &str)> {
    let Some(rest) = path.strip_prefix(API_PREFIX) else { return Vec::new() };
    let rest = rest.strip_suffix('/').filter(|r| !r.is_empty()).unwrap_or(rest);
    let segments: Vec<&str> = rest.split('/').collect();
    for (pattern, _) in API_ROUTES {
        let parts: Vec<&'static str> = pattern.split('/').collect();
        if parts.len() != segments.len() {
            continue;
        }
        let mut parameters = Vec::new();
        let matched = parts.iter().zip(&segments).all(|(part, segment)| {
            match part.strip_prefix('{').and_then(|name| name.strip_suffix('}')) {
                Some(name) => {
                    parameters.push((name, *segment));
                    true
                }
                None => part == segment,
            }
        });
        if matched {
            return parameters;
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_parameters_are_named_by_the_route() {
        assert_eq!(
            path_parameters("/v1/schemas/contacts/records/con_%00"),
            [("schema", "contacts"), ("id", "con_%00")]
        );
        assert_eq!(path_parameters("/v1/record-deletions/op_1/"), [("operationId", "op_1")]);
        assert!(path_parameters("/v1/me").is_empty());
        assert!(path_parameters("/v1/nothing/here").is_empty());
        assert_eq!(allowed_methods("/v1/schemas/contacts/records"), Some(&["GET", "POST"][..]));
        assert_eq!(allowed_methods("/v1/nothing"), None);
        assert!(is_served("POST", "/v1/events/order-placed"));
        assert!(!is_served("PATCH", "/v1/events/ev_1"), "a guard");
        assert!(!is_served("PUT", "/v1/me"));
    }

    #[test]
    fn known_paths_match_patterns() {
        assert!(is_known_path("/v1/me"));
        assert!(is_known_path("/v1/events/ev_123"));
        assert!(is_known_path("/v1/schemas/contacts/records/con_1"));
        assert!(!is_known_path("/v1/nothing"));
        assert!(!is_known_path("/me"));
    }
}
