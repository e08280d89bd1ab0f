//! The signals a hit's request shows (opens and clicks; see `domain::engagement` for what each
//! signal means): a `HEAD` request, no `User-Agent`, Apple's privacy proxy, a known crawler or
//! scanner (the `isbot` list). Judged at the take-in, where the request is; the timing
//! signals are judged later, against the email's history (`domain::engagement::click_timing`).

use std::net::IpAddr;
use std::sync::LazyLock;

use domain::engagement::{Actor, Signal, Timing, click_timing};

/// A tracking link this service did not issue, or one changed in any way: it never
/// redirects and counts nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this link was not issued by this service, or was changed")]
pub struct Forged;

/// What a tracking request showed. Nothing of it is stored: only the verdict is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    /// `HEAD` rather than `GET`.
    pub head: bool,
    pub user_agent: Option<&'a str>,
    pub client: Option<IpAddr>,
}

static BOTS: LazyLock<isbot::Bots> = LazyLock::new(isbot::Bots::default);

/// The request's user agent, unless it is missing or blank.
fn user_agent<'a>(request: &Request<'a>) -> Option<&'a str> {
    request.user_agent.map(str::trim).filter(|agent| !agent.is_empty())
}

/// Apple Mail Privacy Protection's prefetch: from Apple's network, or a bare `Mozilla/5.0`.
fn privacy_proxy(request: &Request<'_>, user_agent: &str) -> bool {
    let apple = matches!(request.client, Some(IpAddr::V4(address)) if address.octets()[0] == 17);
    apple || user_agent == "Mozilla/5.0"
}

/// A mailbox provider's image proxy that fetches when the message is read (Gmail's, Yahoo's):
/// a person's open, though the bot list names the proxy.
fn fetches_when_read(user_agent: &str) -> bool {
    let lowercase = user_agent.to_ascii_lowercase();
    lowercase.contains("googleimageproxy") || lowercase.contains("yahoomailproxy")
}

/// Whose fetch of the open pixel this was.
pub fn open(request: &Request<'_>) -> Actor {
    if request.head {
        return Actor::Machine(Signal::Head);
    }
    let Some(user_agent) = user_agent(request) else { return Actor::Machine(Signal::NoUserAgent) };
    if privacy_proxy(request, user_agent) {
        return Actor::Machine(Signal::PrivacyProxy);
    }
    if !fetches_when_read(user_agent) && BOTS.is_bot(user_agent) {
        return Actor::Machine(Signal::KnownBot);
    }
    Actor::Human
}

/// Whose click this was.
pub fn click(request: &Request<'_>, timing: &Timing) -> Actor {
    match click_request(request) {
        Actor::Human => click_timing(timing),
        machine => machine,
    }
}

/// Whose click this was, as far as the request alone tells (a `HEAD`, no user agent, a
/// known bot); the timing is judged apart ([`click_timing`]), once the email's stream is read.
pub fn click_request(request: &Request<'_>) -> Actor {
    if request.head {
        return Actor::Machine(Signal::Head);
    }
    let Some(user_agent) = user_agent(request) else { return Actor::Machine(Signal::NoUserAgent) };
    if BOTS.is_bot(user_agent) {
        return Actor::Machine(Signal::KnownBot);
    }
    Actor::Human
}

impl platform::refusal::Answered for Forged {}

/// A tracking link this service did not issue, or one changed: 404 `link_not_found`.
impl platform::refusal::Refusal for Forged {
    fn code(&self) -> platform::error::Code {
        platform::error::Code::LinkNotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::engagement::{BURST_WINDOW_MS, SCANNER_WINDOW_MS};

    const BROWSER: &str = "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.0 Safari/605.1.15";

    fn get<'a>(user_agent: &'a str, client: &str) -> Request<'a> {
        Request { head: false, user_agent: Some(user_agent), client: client.parse().ok() }
    }

    #[test]
    fn given_a_mail_client_fetching_the_pixel_when_judged_then_it_is_a_person() {
        assert_eq!(open(&get(BROWSER, "198.51.100.7")), Actor::Human);
        // Gmail's image proxy fetches when the message is opened: a person's open.
        assert_eq!(
            open(&get(
                "Mozilla/5.0 (Windows NT 5.1; rv:11.0) Gecko Firefox/11.0 (via ggpht.com GoogleImageProxy)",
                "66.249.84.1"
            )),
            Actor::Human
        );
    }

    #[test]
    fn given_apple_privacy_protection_when_the_pixel_is_fetched_then_it_is_a_machine() {
        assert_eq!(open(&get(BROWSER, "17.58.63.1")), Actor::Machine(Signal::PrivacyProxy));
        assert_eq!(open(&get("Mozilla/5.0", "104.28.40.9")), Actor::Machine(Signal::PrivacyProxy));
        assert_eq!(
            click(&get(BROWSER, "17.58.63.1"), &Timing::default()),
            Actor::Human,
            "a click from Apple's network is a person's"
        );
    }

    #[test]
    fn given_a_head_request_no_agent_or_a_known_bot_when_judged_then_it_is_a_machine() {
        let head = Request { head: true, ..get(BROWSER, "198.51.100.7") };
        assert_eq!(open(&head), Actor::Machine(Signal::Head));
        assert_eq!(click(&head, &Timing::default()), Actor::Machine(Signal::Head));
        for agent in [None, Some(""), Some("  ")] {
            let request = Request { head: false, user_agent: agent, client: None };
            assert_eq!(open(&request), Actor::Machine(Signal::NoUserAgent), "{agent:?}");
        }
        let crawler = get("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "66.249.66.1");
        assert_eq!(click(&crawler, &Timing::default()), Actor::Machine(Signal::KnownBot));
    }

    #[test]
    fn given_a_click_right_after_delivery_or_right_after_another_link_when_judged_then_it_is_a_scanner() {
        let browser = get(BROWSER, "198.51.100.7");
        let sent = 1_000_000;
        let at = |now_ms: i64, other: Option<i64>| Timing {
            now_ms,
            sent_at_ms: Some(sent),
            other_link_clicked_at_ms: other,
        };
        assert_eq!(click(&browser, &at(sent + 3_000, None)), Actor::Machine(Signal::RightAfterDelivery));
        assert_eq!(
            click(&browser, &at(sent + SCANNER_WINDOW_MS - 1, None)),
            Actor::Machine(Signal::RightAfterDelivery)
        );
        assert_eq!(click(&browser, &at(sent + SCANNER_WINDOW_MS, None)), Actor::Human);
        let later = sent + 60_000;
        assert_eq!(click(&browser, &at(later, Some(later - 500))), Actor::Machine(Signal::LinkBurst));
        assert_eq!(click(&browser, &at(later, Some(later - BURST_WINDOW_MS))), Actor::Human);
        let unsent = Timing { now_ms: later, sent_at_ms: None, other_link_clicked_at_ms: None };
        assert_eq!(click(&browser, &unsent), Actor::Human);
    }
}
