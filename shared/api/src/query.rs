//! Query strings: the pairs of a request, and a parameter's value.

use actix_web::HttpRequest;

/// The last value of query parameter `name` (a repeated parameter's last one wins).
pub fn query_value<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query.iter().rev().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
}

/// Query pairs in order, repeated keys kept.
pub fn query_pairs(req: &HttpRequest) -> Vec<(String, String)> {
    form_urlencoded::parse(req.query_string().as_bytes()).into_owned().collect()
}
