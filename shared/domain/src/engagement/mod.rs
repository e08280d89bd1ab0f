//! Engagement: whether an open or a click was a person's or a machine's, decided from what
//! the request showed and when it came (pure). Machine activity is still recorded, flagged
//! with the signal that gave it away, and left out of "human" counts and conditions.
//!
//! The signals, strongest first:
//! - `head`: a `HEAD` request (link checkers and scanners; a mail client or a browser asks
//!   with `GET`).
//! - `no_user_agent`: no `User-Agent` at all.
//! - `privacy_proxy` (opens): Apple Mail Privacy Protection fetches every image of a message
//!   when the message reaches the device, whether or not it is read. Its fetches come from
//!   Apple's network (`17.0.0.0/8`) or name themselves only `Mozilla/5.0`.
//! - `known_bot`: the user agent is a crawler, a link checker or a security scanner that
//!   says what it is (the `isbot` list), except for the image proxies of Gmail and Yahoo, which
//!   fetch the pixel when the message is read.
//! - `right_after_delivery`: a click within [`SCANNER_WINDOW_MS`] of the relay taking the
//!   message. Security gateways follow every link as the message arrives; people take longer.
//! - `link_burst`: a click within [`BURST_WINDOW_MS`] of a click on another link of the same
//!   email. Scanners fetch all of a message's links at once; a person clicks one at a time.

use std::net::IpAddr;
use std::sync::LazyLock;

pub mod history;

/// A click this soon after the relay accepted the message is a scanner's.
pub const SCANNER_WINDOW_MS: i64 = 10_000;

/// A click this soon after a click on another link of the same email is a scanner's.
pub const BURST_WINDOW_MS: i64 = 2_000;

/// What a tracking request showed. Nothing of it is stored: only the verdict is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    /// `HEAD` rather than `GET`.
    pub head: bool,
    pub user_agent: Option<&'a str>,
    pub client: Option<IpAddr>,
}

/// When the request came, against what is known of the email.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    pub now_ms: i64,
    /// When the relay accepted the message (`EmailSent`), if it has.
    pub sent_at_ms: Option<i64>,
    /// The latest click on another link of the same email, if any (clicks only).
    pub other_link_clicked_at_ms: Option<i64>,
}

/// Why an open or a click is taken for a machine's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Head,
    NoUserAgent,
    PrivacyProxy,
    KnownBot,
    RightAfterDelivery,
    LinkBurst,
}

impl Signal {
    /// The name events and the API use.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Head => "head",
            Signal::NoUserAgent => "no_user_agent",
            Signal::PrivacyProxy => "privacy_proxy",
            Signal::KnownBot => "known_bot",
            Signal::RightAfterDelivery => "right_after_delivery",
            Signal::LinkBurst => "link_burst",
        }
    }
}

/// Whose activity an open or a click was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    Human,
    Machine(Signal),
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

/// The purpose of the system key that seals a click's target in `engagement_inbox`.
const INBOX_KEY: &str = "engagement-inbox";

/// Seals a click's target for `engagement_inbox`, under the system's inbox key with the
/// email's id bound in (so a row cannot be moved to another email).
pub fn seal_inbox_link(email_id: &str, url: &str) -> anyhow::Result<Vec<u8>> {
    platform::crypto::keyring()?.system_key(INBOX_KEY).encrypt(email_id, url.as_bytes())
}

/// A click's target as [`seal_inbox_link`] sealed it.
pub fn open_inbox_link(email_id: &str, sealed: &[u8]) -> anyhow::Result<String> {
    let bytes = platform::crypto::keyring()?.system_key(INBOX_KEY).decrypt(email_id, sealed)?;
    Ok(String::from_utf8(bytes)?)
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

/// Whose click this was, as its timing tells: right after delivery, or in a burst over the
/// email's links.
pub fn click_timing(timing: &Timing) -> Actor {
    let within = |at: Option<i64>, window: i64| at.is_some_and(|at| (0..window).contains(&(timing.now_ms - at)));
    if within(timing.sent_at_ms, SCANNER_WINDOW_MS) {
        return Actor::Machine(Signal::RightAfterDelivery);
    }
    if within(timing.other_link_clicked_at_ms, BURST_WINDOW_MS) {
        return Actor::Machine(Signal::LinkBurst);
    }
    Actor::Human
}

impl Signal {
    /// The signal a name stands for (`None` for an unknown name or the empty one, a person's).
    pub fn parse(name: &str) -> Option<Self> {
        [
            Signal::Head,
            Signal::NoUserAgent,
            Signal::PrivacyProxy,
            Signal::KnownBot,
            Signal::RightAfterDelivery,
            Signal::LinkBurst,
        ]
        .into_iter()
        .find(|signal| signal.as_str() == name)
    }
}

impl Actor {
    /// The actor a stored signal names: a machine's with it, a person's without.
    pub fn from_signal(name: &str) -> Self {
        Signal::parse(name).map_or(Actor::Human, Actor::Machine)
    }

    /// The signal's name, empty for a person.
    pub fn signal(self) -> &'static str {
        match self {
            Actor::Human => "",
            Actor::Machine(signal) => signal.as_str(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
