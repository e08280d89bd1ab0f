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

pub mod history;

/// A click this soon after the relay accepted the message is a scanner's.
pub const SCANNER_WINDOW_MS: i64 = 10_000;

/// A click this soon after a click on another link of the same email is a scanner's.
pub const BURST_WINDOW_MS: i64 = 2_000;

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
