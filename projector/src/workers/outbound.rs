//! Calls to the outside over HTTP, as webhook delivery and workflow webhook steps make them:
//! what an answer or a failure comes to, `Retry-After`, and the resolver that refuses
//! loopback, private and metadata addresses at connect time.

use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use domain::webhooks::target;

/// The longest `Retry-After` honoured.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(24 * 3600);
/// The longest error message kept.
const ERROR_MAX_CHARS: usize = 500;

/// The HTTP client of outbound calls: `timeout` per call (and at most 10 s to connect), no
/// redirects followed, hosts resolved through [`GuardedResolver`], this user agent.
pub(crate) fn client(timeout: Duration, allow_loopback: bool, user_agent: &str) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(std::sync::Arc::new(GuardedResolver { allow_loopback }))
        .user_agent(user_agent)
        .build()
}

pub(crate) use domain::webhooks::attempt::AttemptResult;

/// The outcome of an answer.
pub(crate) fn classify(status: u16, retry_after: Option<Duration>) -> AttemptResult {
    match status {
        200..=299 => AttemptResult::Delivered { status },
        410 => AttemptResult::Gone,
        408 | 429 | 500..=599 => {
            AttemptResult::Retryable { status: Some(status), error: status_text(status), retry_after }
        }
        _ => AttemptResult::Rejected { status: Some(status), error: status_text(status) },
    }
}

fn status_text(status: u16) -> String {
    let reason = reqwest::StatusCode::from_u16(status).ok().and_then(|code| code.canonical_reason());
    match reason {
        Some(reason) => format!("HTTP {status} {reason}"),
        None => format!("HTTP {status}"),
    }
}

/// `Retry-After` in seconds or as an HTTP date, bounded.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    let delay = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let at = DateTime::parse_from_rfc2822(value).ok()?.with_timezone(&Utc);
            (at - Utc::now()).to_std().unwrap_or_default()
        }
    };
    Some(delay.min(RETRY_AFTER_MAX))
}

/// A transport error with its causes, bounded.
pub(crate) fn describe(error: &reqwest::Error) -> String {
    let mut text = if error.is_timeout() { "timed out".to_owned() } else { error.to_string() };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text.chars().take(ERROR_MAX_CHARS).collect()
}

/// Resolves delivery hosts and refuses any whose addresses include a refused one
/// (loopback unless allowed, private, link-local, metadata...): the check at connect time,
/// against DNS rebinding.
pub(crate) struct GuardedResolver {
    pub(crate) allow_loopback: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_loopback = self.allow_loopback;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(refusal) =
                addresses.iter().find_map(|address| target::address_refusal(address.ip(), allow_loopback))
            {
                return Err(format!("{host} resolves to a refused address: {}", refusal.message()).into());
            }
            let addresses: reqwest::dns::Addrs = Box::new(addresses.into_iter());
            Ok(addresses)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified_as_the_contract_says() {
        assert_eq!(classify(204, None), AttemptResult::Delivered { status: 204 });
        assert_eq!(classify(410, None), AttemptResult::Gone);
        for retried in [408, 429, 500, 503] {
            assert!(matches!(classify(retried, None), AttemptResult::Retryable { .. }), "{retried}");
        }
        for rejected in [301, 400, 401, 404, 422] {
            assert!(matches!(classify(rejected, None), AttemptResult::Rejected { .. }), "{rejected}");
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_is_bounded() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, "7".parse().expect("header"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(reqwest::header::RETRY_AFTER, "99999999".parse().expect("header"));
        assert_eq!(retry_after(&headers), Some(RETRY_AFTER_MAX));
        headers.insert(reqwest::header::RETRY_AFTER, "soon".parse().expect("header"));
        assert_eq!(retry_after(&headers), None);
    }

    #[tokio::test]
    async fn at_connect_time_a_host_resolving_to_a_refused_address_is_refused() {
        use reqwest::dns::Resolve;
        let name = |host: &str| host.parse::<reqwest::dns::Name>().expect("a host name");
        let strict = GuardedResolver { allow_loopback: false };
        let refused = strict.resolve(name("localhost")).await;
        assert!(refused.is_err(), "localhost resolves to loopback, refused by default");
        let local = GuardedResolver { allow_loopback: true };
        let allowed = local.resolve(name("localhost")).await.expect("allowed for development");
        assert!(allowed.into_iter().all(|address| address.ip().is_loopback()));
    }
}
