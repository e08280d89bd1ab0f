//! A space's send policy and the clock it reads: quiet hours in the recipient's local time,
//! frequency caps over a window of hours or of the recipient's calendar days, and the next
//! instant each allows. Pure: every function takes the time it decides at.

use chrono::{DateTime, Duration, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// What a rule does to a marketing send it refuses now: hold it until the rule allows it,
/// or skip it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Hold,
    Skip,
}

/// The policy of a space, as the catalog holds it (topic slugs resolved to ids at apply).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendPolicy {
    pub time_zone: ZoneRule,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_hours: Option<QuietHours>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frequency_caps: Vec<Cap>,
}

/// Where a recipient's time zone comes from: a contact attribute holding an IANA zone name,
/// or else the space's default zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ZoneRule {
    /// The contact attribute's key; `None`: every recipient is in the default zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribute: Option<String>,
    /// An IANA zone name (`Europe/Berlin`), checked at apply.
    pub default: String,
}

/// A local window in which marketing mail is not sent, `from` inclusive, `to` exclusive;
/// across midnight when `to` is earlier than `from`; empty when they are equal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QuietHours {
    /// Minutes after local midnight, 0..1440.
    pub from_minute: u32,
    pub to_minute: u32,
    pub outcome: Outcome,
}

/// At most `max` marketing emails per contact per `window` (of the topic, when set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cap {
    pub max: u32,
    pub window: Window,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<String>,
    pub outcome: Outcome,
}

/// A cap's window: the last `n` hours, or today and the `n - 1` calendar days before it in
/// the recipient's zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Window {
    Hours(u32),
    Days(u32),
}

/// The most rules a policy holds.
pub const MAX_CAPS: usize = 10;

/// The longest window of hours a cap may have (a year).
pub const MAX_WINDOW_HOURS: u32 = 8_760;

/// The longest window of calendar days a cap may have.
pub const MAX_WINDOW_DAYS: u32 = 366;

impl Window {
    /// How far back a cap with this window counts ([`SendPolicy::lookback_ms`]): a
    /// calendar-day window reaches back its days and two more, for zones.
    pub fn lookback_ms(self) -> i64 {
        match self {
            Window::Hours(hours) => i64::from(hours) * 3_600_000,
            Window::Days(days) => (i64::from(days) + 2) * 86_400_000,
        }
    }

    /// The longest any cap may look back: a marketing send older than this counts for none.
    pub fn longest_lookback_ms() -> i64 {
        Window::Hours(MAX_WINDOW_HOURS).lookback_ms().max(Window::Days(MAX_WINDOW_DAYS).lookback_ms())
    }
}

/// A marketing email the contact was sent (scheduled to send): when, its topic, the log
/// position of its `EmailScheduled`, and its place among the contact's marketing sends (0 for
/// one decided without caps, which has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub at_ms: i64,
    pub topic_id: Option<String>,
    pub position: i64,
    pub seq: i64,
}

/// The zone named `name` (an IANA name, in any letter case: `asia/kolkata` is
/// `Asia/Kolkata`), if it is one. A UTC offset (`+05:30`) is not a zone: it knows no daylight
/// saving time.
pub fn zone(name: &str) -> Option<Tz> {
    name.parse().ok().or_else(|| {
        let name = name.trim();
        chrono_tz::TZ_VARIANTS.iter().find(|tz| tz.name().eq_ignore_ascii_case(name)).copied()
    })
}

/// Where the zone a send was decided in came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneSource {
    /// The contact's zone attribute.
    Contact,
    /// The policy's default: the contact has no value.
    Default,
    /// The policy's default, because the contact's value is not a time zone (flagged in the
    /// email's story).
    Invalid,
}

impl ZoneSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ZoneSource::Contact => "contact",
            ZoneSource::Default => "default",
            ZoneSource::Invalid => "invalid",
        }
    }
}

impl ZoneRule {
    /// The recipient's zone: its attribute's value when that names a zone, else the default
    /// (UTC if even that does not parse, which apply prevents).
    pub fn resolve(&self, recipient_zone: Option<&str>) -> Tz {
        self.explain(recipient_zone).0
    }

    /// [`ZoneRule::resolve`], with where the zone came from.
    pub fn explain(&self, recipient_zone: Option<&str>) -> (Tz, ZoneSource) {
        let default = zone(&self.default).unwrap_or(Tz::UTC);
        match recipient_zone.filter(|value| !value.trim().is_empty()) {
            None => (default, ZoneSource::Default),
            Some(value) => zone(value).map_or((default, ZoneSource::Invalid), |tz| (tz, ZoneSource::Contact)),
        }
    }
}

fn instant(at_ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at_ms).unwrap_or_default()
}

/// The first instant after `after_ms` whose local time in `tz` is `local`; when `local` does
/// not exist (a clock moved forward over it), the instant the clock moved.
pub fn first_instant(tz: Tz, local: NaiveDateTime, after_ms: i64) -> i64 {
    let mut probe = local;
    // Gaps are at most a few hours long; a minute's steps find their end.
    for _ in 0..=24 * 60 {
        match tz.from_local_datetime(&probe) {
            LocalResult::Single(at) => return at.timestamp_millis(),
            // A clock moved back: the local time happens twice.
            LocalResult::Ambiguous(earlier, later) => {
                let earlier = earlier.timestamp_millis();
                return if earlier > after_ms { earlier } else { later.timestamp_millis() };
            }
            LocalResult::None => probe = truncate_to_minute(probe) + Duration::minutes(1),
        }
    }
    local.and_utc().timestamp_millis()
}

/// The first instant in `(from_ms, to_ms]` at which the zone's offset differs from its
/// offset at `from_ms` (a clock change), if there is one.
fn offset_change(tz: Tz, from_ms: i64, to_ms: i64) -> Option<i64> {
    let offset = |at_ms: i64| instant(at_ms).with_timezone(&tz).offset().fix().local_minus_utc();
    let before = offset(from_ms);
    if offset(to_ms) == before {
        return None;
    }
    let (mut low, mut high) = (from_ms, to_ms);
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        if offset(middle) == before { low = middle } else { high = middle }
    }
    Some(high)
}

fn truncate_to_minute(local: NaiveDateTime) -> NaiveDateTime {
    local.with_second(0).and_then(|local| local.with_nanosecond(0)).unwrap_or(local)
}

fn local(tz: Tz, at_ms: i64) -> NaiveDateTime {
    instant(at_ms).with_timezone(&tz).naive_local()
}

fn minute_of_day(local: NaiveDateTime) -> u32 {
    local.hour() * 60 + local.minute()
}

fn at_minute(date: NaiveDate, minute: u32) -> NaiveDateTime {
    date.and_time(NaiveTime::from_hms_opt(minute / 60, minute % 60, 0).unwrap_or_default())
}

impl QuietHours {
    fn contains(&self, minute: u32) -> bool {
        let (from, to) = (self.from_minute, self.to_minute);
        match from.cmp(&to) {
            std::cmp::Ordering::Equal => false,
            std::cmp::Ordering::Less => from <= minute && minute < to,
            std::cmp::Ordering::Greater => minute >= from || minute < to,
        }
    }

    /// Whether `at_ms` falls in the window in `tz`.
    pub fn is_quiet(&self, tz: Tz, at_ms: i64) -> bool {
        self.contains(minute_of_day(local(tz, at_ms)))
    }

    /// When the window that holds `at_ms` ends (the first instant after it that is not
    /// quiet); `None` when `at_ms` is not quiet.
    ///
    /// The clock leaves the window when it shows `to`, or when it jumps: a clock moved back
    /// can leave it early (quiet 02:01 to 03:00 on the night 03:00 becomes 02:00 ends at the
    /// jump), and a clock moved forward can skip all of the time between two windows (quiet
    /// from 02:42 to 02:00 on the night 02:00 becomes 03:00: the end is the next day's).
    pub fn ends_after(&self, tz: Tz, at_ms: i64) -> Option<i64> {
        let mut from = at_ms;
        for _ in 0..6 {
            let end = self.window_end(tz, from)?;
            if let Some(jump) = offset_change(tz, from, end) {
                if !self.is_quiet(tz, jump) {
                    return Some(jump);
                }
                from = jump;
                continue;
            }
            if !self.is_quiet(tz, end) {
                return Some(end);
            }
            from = end;
        }
        self.window_end(tz, from)
    }

    /// The end of the window's day that holds `at_ms`: when its local clock shows `to`.
    fn window_end(&self, tz: Tz, at_ms: i64) -> Option<i64> {
        let now = local(tz, at_ms);
        let minute = minute_of_day(now);
        if !self.contains(minute) {
            return None;
        }
        // Across midnight and past its start: the window ends tomorrow.
        let date = if self.from_minute > self.to_minute && minute >= self.from_minute {
            now.date().succ_opt().unwrap_or(now.date())
        } else {
            now.date()
        };
        Some(first_instant(tz, at_minute(date, self.to_minute), at_ms).max(at_ms + 1))
    }
}

impl Cap {
    fn counts(&self, sent: &Sent) -> bool {
        self.topic_id.as_ref().is_none_or(|topic| sent.topic_id.as_ref() == Some(topic))
    }

    /// The sends in the window at `at_ms`, newest first.
    fn in_window<'a>(&self, tz: Tz, at_ms: i64, sent: &'a [Sent]) -> Vec<&'a Sent> {
        let mut counted: Vec<&Sent> = sent
            .iter()
            // A send recorded after `at_ms` counts too: another process decided it after this
            // decision's clock was read (or on a clock a little ahead), and it went out all the
            // same. Leaving it out let two sends read from the same moment both pass a cap.
            .filter(|sent| self.counts(sent))
            .filter(|sent| match self.window {
                Window::Hours(hours) => sent.at_ms > at_ms - i64::from(hours) * 3_600_000,
                Window::Days(days) => {
                    let today = local(tz, at_ms).date();
                    let first = today - Duration::days(i64::from(days.max(1)) - 1);
                    local(tz, sent.at_ms).date() >= first
                }
            })
            .collect();
        counted.sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then(b.position.cmp(&a.position)));
        counted
    }

    /// Whether the cap is reached at `at_ms`: the send that filled it (the newest counted)
    /// and the instant it allows another (when the `max`-th newest leaves the window).
    pub fn reached(&self, tz: Tz, at_ms: i64, sent: &[Sent]) -> Option<(i64, Sent)> {
        let max = usize::try_from(self.max).unwrap_or(usize::MAX);
        let counted = self.in_window(tz, at_ms, sent);
        if counted.len() < max {
            return None;
        }
        let newest = (*counted.first()?).clone();
        let leaving = counted.get(max.saturating_sub(1)).copied().unwrap_or(&newest);
        let allows = match self.window {
            Window::Hours(hours) => leaving.at_ms + i64::from(hours) * 3_600_000,
            Window::Days(days) => {
                let date = local(tz, leaving.at_ms).date() + Duration::days(i64::from(days.max(1)));
                first_instant(tz, date.and_time(NaiveTime::MIN), at_ms)
            }
        };
        Some((allows.max(at_ms + 1), newest))
    }
}

/// What the policy says about a marketing send at `now_ms` to a recipient in `tz` with
/// marketing sends `sent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ruling {
    Allow,
    /// Refused until `until_ms` by `rule`.
    Hold {
        until_ms: i64,
        rule: Rule,
    },
    /// Refused by `rule`; `filled_by` is the send that filled the cap.
    Skip {
        rule: Rule,
        filled_by: Option<i64>,
    },
}

/// The rule of a policy that refused a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    QuietHours,
    FrequencyCap,
}

impl SendPolicy {
    /// How far back the caps count (sends before `now - lookback` never count); `None`
    /// without caps. A calendar-day window reaches back its days and two more, for zones.
    pub fn lookback_ms(&self) -> Option<i64> {
        self.frequency_caps.iter().map(|cap| cap.window.lookback_ms()).max()
    }

    /// A cap whose outcome is skip and that is reached skips the send; quiet hours now with
    /// outcome skip skip it. Otherwise a send refused by a cap or quiet hours is held until
    /// the first instant every rule allows: past every reached cap's window, then past the
    /// quiet hours it would land in (a cap allows for good once its window has passed, so
    /// one pass finds the instant).
    pub fn rule(&self, tz: Tz, now_ms: i64, sent: &[Sent]) -> Ruling {
        let reached: Vec<(&Cap, (i64, Sent))> = self
            .frequency_caps
            .iter()
            .filter_map(|cap| cap.reached(tz, now_ms, sent).map(|found| (cap, found)))
            .collect();
        if let Some((_, (_, filled))) = reached.iter().find(|(cap, _)| cap.outcome == Outcome::Skip) {
            return Ruling::Skip { rule: Rule::FrequencyCap, filled_by: Some(filled.position) };
        }
        let quiet = self.quiet_hours.as_ref();
        if quiet.is_some_and(|quiet| quiet.outcome == Outcome::Skip && quiet.is_quiet(tz, now_ms)) {
            return Ruling::Skip { rule: Rule::QuietHours, filled_by: None };
        }
        let capped_until = reached.iter().map(|(_, (allows, _))| *allows).max();
        let until = self.allowed_from(tz, capped_until.unwrap_or(now_ms));
        let rule = if capped_until.is_none() { Rule::QuietHours } else { Rule::FrequencyCap };
        if until == now_ms { Ruling::Allow } else { Ruling::Hold { until_ms: until, rule } }
    }

    /// The first instant from `at_ms` that is outside the quiet hours.
    fn allowed_from(&self, tz: Tz, at_ms: i64) -> i64 {
        self.quiet_hours.as_ref().and_then(|quiet| quiet.ends_after(tz, at_ms)).unwrap_or(at_ms)
    }

    /// Why the policy skips a send at `now_ms` (a [`Ruling::Skip`]), for the refusal's answer:
    /// the rule by its place in the workspace file, in words, and the first instant every rule
    /// would allow the send (past every reached cap's window, then past the quiet hours).
    /// `None` when the policy does not skip it.
    pub fn explain_skip(&self, tz: Tz, now_ms: i64, sent: &[Sent]) -> Option<SkipReason> {
        let reached: Vec<(usize, &Cap, i64)> = self
            .frequency_caps
            .iter()
            .enumerate()
            .filter_map(|(index, cap)| cap.reached(tz, now_ms, sent).map(|(allows, _)| (index, cap, allows)))
            .collect();
        let allowed_at_ms = self.allowed_from(tz, reached.iter().map(|(_, _, allows)| *allows).max().unwrap_or(now_ms));
        if let Some((index, cap, _)) = reached.iter().find(|(_, cap, _)| cap.outcome == Outcome::Skip) {
            return Some(SkipReason {
                rule: format!("sendPolicy.frequencyCaps[{index}]"),
                description: cap.describe(),
                allowed_at_ms,
            });
        }
        let quiet = self.quiet_hours.as_ref().filter(|quiet| quiet.outcome == Outcome::Skip)?;
        quiet.is_quiet(tz, now_ms).then(|| SkipReason {
            rule: "sendPolicy.quietHours".to_owned(),
            description: format!(
                "no marketing email from {} to {} in the contact's time zone ({tz})",
                clock(quiet.from_minute),
                clock(quiet.to_minute)
            ),
            allowed_at_ms,
        })
    }
}

/// A skip by the send policy, explained: which rule (`sendPolicy.frequencyCaps[1]`,
/// `sendPolicy.quietHours`), what it says, and when a send would be allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkipReason {
    pub rule: String,
    pub description: String,
    pub allowed_at_ms: i64,
}

/// `minute` after midnight as `HH:MM`.
fn clock(minute: u32) -> String {
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

impl Cap {
    /// The cap in words: "at most 3 marketing emails of topic top_1 per 7 days".
    fn describe(&self) -> String {
        let topic = self.topic_id.as_ref().map(|topic| format!(" of topic {topic}")).unwrap_or_default();
        let window = match self.window {
            Window::Hours(1) => "hour".to_owned(),
            Window::Hours(hours) => format!("{hours} hours"),
            Window::Days(1) => "day (the contact's calendar day)".to_owned(),
            Window::Days(days) => format!("{days} days (the contact's calendar days)"),
        };
        let emails = if self.max == 1 { "email" } else { "emails" };
        format!("at most {} marketing {emails}{topic} per {window}", self.max)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MINUTE: i64 = 60_000;
    const HOUR: i64 = 60 * MINUTE;

    /// Zones from UTC-12 to UTC+14: with and without daylight saving time, both hemispheres,
    /// half- and quarter-hour offsets, a 30-minute DST shift and a DST change at midnight.
    const ZONES: &[&str] = &[
        "Etc/GMT+12",
        "Pacific/Pago_Pago",
        "America/Los_Angeles",
        "America/New_York",
        "America/St_Johns",
        "America/Santiago",
        "America/Sao_Paulo",
        "UTC",
        "Europe/London",
        "Europe/Berlin",
        "Asia/Tehran",
        "Asia/Kolkata",
        "Asia/Kathmandu",
        "Asia/Tokyo",
        "Australia/Adelaide",
        "Australia/Lord_Howe",
        "Pacific/Auckland",
        "Pacific/Chatham",
        "Pacific/Tongatapu",
        "Pacific/Kiritimati",
    ];

    /// Those of them that change their clocks in 2026 (both hemispheres, a 30-minute change,
    /// one at midnight).
    const DST_ZONES: &[&str] = &[
        "America/Los_Angeles",
        "America/New_York",
        "America/St_Johns",
        "America/Santiago",
        "Europe/London",
        "Europe/Berlin",
        "Australia/Adelaide",
        "Australia/Lord_Howe",
        "Pacific/Auckland",
        "Pacific/Chatham",
    ];

    /// 2020-01-01 to 2031-01-01.
    const FROM_MS: i64 = 1_577_836_800_000;
    const TO_MS: i64 = 1_924_992_000_000;

    fn tz(index: usize) -> Tz {
        zone(ZONES[index % ZONES.len()]).expect("a zone")
    }

    fn quiet(from_minute: u32, to_minute: u32) -> QuietHours {
        QuietHours { from_minute, to_minute, outcome: Outcome::Hold }
    }

    /// The first instant, at minute steps after `now` and before `end`, that is not quiet, or
    /// `end` itself when it is quiet; `None` when `end` is the first instant that is not.
    fn first_unquiet_minute(quiet: &QuietHours, tz: Tz, now: i64, end: i64) -> Option<i64> {
        if quiet.is_quiet(tz, end) {
            return Some(end);
        }
        let mut at = now - now.rem_euclid(MINUTE) + MINUTE;
        while at < end {
            if !quiet.is_quiet(tz, at) {
                return Some(at);
            }
            at += MINUTE;
        }
        None
    }

    /// Instants next to the DST transitions of `tz` in 2026 (every minute of the day around
    /// each, where a window's start or end most often lands in a gap or a fold).
    fn around_transitions(tz: Tz) -> Vec<i64> {
        let start = 1_767_225_600_000; // 2026-01-01
        let mut found = Vec::new();
        let mut at = start;
        let offset = |at: i64| instant(at).with_timezone(&tz).naive_local().and_utc().timestamp_millis() - at;
        while at < start + 366 * 24 * HOUR {
            if offset(at) != offset(at + 6 * HOUR) {
                found.push(at);
            }
            at += 6 * HOUR;
        }
        found
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// The end of quiet hours is the first instant, at minute steps, that is not quiet:
        /// every minute before it since `now` is quiet, it is not, and it is within a day
        /// and a DST shift.
        #[test]
        fn quiet_hours_end_at_the_first_instant_that_is_not_quiet(
            zone_index in 0..ZONES.len(),
            now in FROM_MS..TO_MS,
            from in 0u32..1440,
            to in 0u32..1440,
        ) {
            let (tz, quiet) = (tz(zone_index), quiet(from, to));
            match quiet.ends_after(tz, now) {
                None => prop_assert!(!quiet.is_quiet(tz, now)),
                Some(end) => {
                    prop_assert!(quiet.is_quiet(tz, now));
                    prop_assert!(from != to, "an empty window is never quiet");
                    prop_assert!(end > now && end - now <= 26 * HOUR, "{} minutes", (end - now) / MINUTE);
                    prop_assert_eq!(first_unquiet_minute(&quiet, tz, now, end), None);
                }
            }
        }

        /// Around every DST transition of the year, the same holds.
        #[test]
        fn quiet_hours_end_right_across_daylight_saving_transitions(
            zone_index in 0..DST_ZONES.len(),
            pick in any::<prop::sample::Index>(),
            offset_minutes in -720i64..720,
            from in 0u32..1440,
            to in 0u32..1440,
        ) {
            let tz = zone(DST_ZONES[zone_index]).expect("a zone");
            let transitions = around_transitions(tz);
            prop_assert!(transitions.len() >= 2, "{} changes its clocks twice a year", DST_ZONES[zone_index]);
            let now = transitions[pick.index(transitions.len())] + offset_minutes * MINUTE;
            let quiet = quiet(from, to);
            if let Some(end) = quiet.ends_after(tz, now) {
                prop_assert_eq!(first_unquiet_minute(&quiet, tz, now, end), None);
            }
        }

        /// A reached cap allows a send at the instant it names and not a minute before.
        #[test]
        fn a_cap_allows_again_exactly_when_its_window_has_passed(
            zone_index in 0..ZONES.len(),
            now in FROM_MS..TO_MS,
            max in 1u32..4,
            hours in prop::option::of(1u32..72),
            days in 1u32..8,
            ago in prop::collection::vec(0i64..(10 * 24 * 60), 0..8),
        ) {
            let tz = tz(zone_index);
            let window = hours.map_or(Window::Days(days), Window::Hours);
            let cap = Cap { max, window, topic_id: None, outcome: Outcome::Hold };
            let sent: Vec<Sent> = ago
                .iter()
                .enumerate()
                .map(|(position, ago)| Sent { at_ms: now - ago * MINUTE, topic_id: None, position: position as i64, seq: position as i64 })
                .collect();
            match cap.reached(tz, now, &sent) {
                None => prop_assert!(cap.in_window(tz, now, &sent).len() < max as usize),
                Some((allows, _)) => {
                    prop_assert!(allows > now);
                    prop_assert!(cap.reached(tz, allows, &sent).is_none(), "still reached when it allows");
                    prop_assert!(cap.reached(tz, allows - 1, &sent).is_some() || allows == now + 1,
                        "allowed before the instant it names");
                }
            }
        }

        /// A hold lands where every rule allows: not quiet, no cap reached.
        #[test]
        fn a_hold_lands_where_every_rule_allows(
            zone_index in 0..ZONES.len(),
            now in FROM_MS..TO_MS,
            from in 0u32..1440,
            to in 0u32..1440,
            max in 1u32..3,
            hours in 1u32..48,
            ago in prop::collection::vec(0i64..(3 * 24 * 60), 0..5),
        ) {
            let tz = tz(zone_index);
            let policy = SendPolicy {
                time_zone: ZoneRule { attribute: None, default: "UTC".into() },
                quiet_hours: Some(quiet(from, to)),
                frequency_caps: vec![Cap { max, window: Window::Hours(hours), topic_id: None, outcome: Outcome::Hold }],
            };
            let sent: Vec<Sent> =
                ago.iter().map(|ago| Sent { at_ms: now - ago * MINUTE, topic_id: None, position: 1, seq: 1 }).collect();
            match policy.rule(tz, now, &sent) {
                Ruling::Allow => {
                    prop_assert!(!quiet(from, to).is_quiet(tz, now));
                    prop_assert!(policy.frequency_caps[0].reached(tz, now, &sent).is_none());
                }
                Ruling::Hold { until_ms, .. } => {
                    prop_assert!(until_ms > now);
                    prop_assert_eq!(policy.rule(tz, until_ms, &sent), Ruling::Allow);
                }
                Ruling::Skip { .. } => prop_assert!(false, "nothing here skips"),
            }
        }
    }

    #[test]
    fn a_window_that_ends_in_a_spring_forward_gap_ends_when_the_clock_jumps() {
        // Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00Z). Quiet 22:00-02:30.
        let berlin = zone("Europe/Berlin").expect("a zone");
        let quiet = quiet(22 * 60, 150);
        let midnight = 1_774_738_800_000; // 2026-03-28T23:00:00Z = 00:00 CET
        assert_eq!(quiet.ends_after(berlin, midnight), Some(1_774_746_000_000)); // 01:00Z = 03:00 CEST
    }

    #[test]
    fn a_window_that_ends_in_a_fall_back_fold_ends_at_its_first_occurrence() {
        // New York, 2026-11-01: 02:00 EDT becomes 01:00 EST (06:00Z). Quiet 21:00-01:30.
        let new_york = zone("America/New_York").expect("a zone");
        let quiet = quiet(21 * 60, 90);
        let before = 1_793_505_600_000; // 2026-11-01T04:00:00Z = 00:00 EDT
        assert_eq!(quiet.ends_after(new_york, before), Some(1_793_511_000_000)); // 05:30Z = 01:30 EDT
        // The clock shows 01:10 again an hour later (EST): quiet by the clock, until 01:30 EST.
        let repeated = 1_793_513_400_000; // 06:10Z = 01:10 EST
        assert_eq!(quiet.ends_after(new_york, repeated), Some(1_793_514_600_000)); // 06:30Z
    }

    #[test]
    fn zones_ahead_of_utc_end_the_window_on_their_own_date() {
        // Kiritimati (+14): 2026-05-28T20:26Z is 10:26 on the 29th; quiet 09:00-12:00 ends
        // at 12:00 local on the 29th = 22:00Z on the 28th.
        let kiritimati = zone("Pacific/Kiritimati").expect("a zone");
        let quiet = quiet(9 * 60, 12 * 60);
        assert_eq!(quiet.ends_after(kiritimati, 1_780_000_000_000), Some(1_780_005_600_000));
    }

    #[test]
    fn a_send_recorded_after_the_decisions_clock_counts_against_the_cap() {
        // A journey read the clock, then the contact's sends: a broadcast's send, decided a few
        // milliseconds later, is among them. It fills the cap as any earlier send would.
        let now = 1_779_982_200_000;
        let sent = [Sent { at_ms: now + 40, topic_id: None, position: 9, seq: 1 }];
        for window in [Window::Days(1), Window::Hours(24)] {
            let cap = Cap { max: 1, window, topic_id: None, outcome: Outcome::Skip };
            let (allows, filled) = cap.reached(Tz::UTC, now, &sent).expect("the cap is reached");
            assert_eq!(filled.position, 9);
            assert!(allows > now + 40, "allowed only after the later send leaves the window");
        }
    }

    #[test]
    fn calendar_day_windows_count_the_recipients_days_not_utcs() {
        // Tokyo (+9): one send a day. Sent at 2026-05-28T14:00Z (23:00 in Tokyo, the 28th);
        // at 15:30Z it is 00:30 on the 29th in Tokyo: a new day, allowed; in UTC, still the 28th.
        let cap = Cap { max: 1, window: Window::Days(1), topic_id: None, outcome: Outcome::Hold };
        let sent = [Sent { at_ms: 1_779_976_800_000, topic_id: None, position: 1, seq: 1 }];
        let tokyo = zone("Asia/Tokyo").expect("a zone");
        assert!(cap.reached(tokyo, 1_779_982_200_000, &sent).is_none());
        let (allows, _) = cap.reached(Tz::UTC, 1_779_982_200_000, &sent).expect("reached in UTC");
        assert_eq!(allows, 1_780_012_800_000, "midnight UTC of the 29th");
    }

    #[test]
    fn a_skip_names_its_rule_by_its_place_in_the_file_and_when_a_send_would_be_allowed() {
        let at = 1_779_982_200_000; // 2026-05-28T15:30Z
        let sent: Vec<Sent> = (1..=3)
            .map(|n| Sent { at_ms: at - n * HOUR, topic_id: Some("top_1".into()), position: n, seq: n })
            .collect();
        let policy = SendPolicy {
            time_zone: ZoneRule { attribute: None, default: "UTC".into() },
            // Quiet from 20:00 to 07:00: a send allowed by the caps at 18:30 is allowed then.
            quiet_hours: Some(QuietHours { from_minute: 20 * 60, to_minute: 7 * 60, outcome: Outcome::Hold }),
            frequency_caps: vec![
                Cap { max: 10, window: Window::Days(1), topic_id: None, outcome: Outcome::Hold },
                Cap { max: 3, window: Window::Hours(6), topic_id: Some("top_1".into()), outcome: Outcome::Skip },
            ],
        };
        let reason = policy.explain_skip(Tz::UTC, at, &sent).expect("skipped");
        assert_eq!(reason.rule, "sendPolicy.frequencyCaps[1]");
        assert_eq!(reason.description, "at most 3 marketing emails of topic top_1 per 6 hours");
        // The oldest of the three (12:30Z) leaves the 6-hour window at 18:30Z.
        assert_eq!(reason.allowed_at_ms, at + 3 * HOUR);
        assert!(matches!(policy.rule(Tz::UTC, at, &sent), Ruling::Skip { rule: Rule::FrequencyCap, .. }));

        // Within the window late in the day, the quiet hours push it to the next morning.
        let late = at + 2 * HOUR; // 17:30Z: the cap allows at 18:30Z; quiet from 20:00
        let late_sent: Vec<Sent> = (1..=3)
            .map(|n| Sent { at_ms: late - 5 * HOUR + n * MINUTE, topic_id: None, position: n, seq: n })
            .collect();
        let quiet_skip = SendPolicy {
            quiet_hours: Some(QuietHours { from_minute: 17 * 60, to_minute: 7 * 60, outcome: Outcome::Skip }),
            frequency_caps: Vec::new(),
            ..policy.clone()
        };
        let reason = quiet_skip.explain_skip(Tz::UTC, late, &late_sent).expect("quiet");
        assert_eq!(reason.rule, "sendPolicy.quietHours");
        assert_eq!(reason.description, "no marketing email from 17:00 to 07:00 in the contact's time zone (UTC)");
        assert_eq!(reason.allowed_at_ms, 1_780_038_000_000, "07:00Z the next day");
        assert_eq!(policy.explain_skip(Tz::UTC, at, &[]), None, "nothing skips an uncapped send by day");
    }

    #[test]
    fn a_zone_is_an_iana_name_in_any_case_and_anything_else_falls_back_flagged() {
        assert_eq!(zone("asia/kolkata"), Some(Tz::Asia__Kolkata));
        assert_eq!(zone("EUROPE/BERLIN"), Some(Tz::Europe__Berlin));
        assert_eq!(zone(" America/New_York "), Some(Tz::America__New_York));
        for not_a_zone in ["Mars/Olympus", "+05:30", "UTC+5:30", "", "Asia"] {
            assert_eq!(zone(not_a_zone), None, "{not_a_zone:?}");
        }
        let rule = ZoneRule { attribute: Some("timeZone".into()), default: "Europe/Berlin".into() };
        assert_eq!(rule.explain(Some("asia/kolkata")), (Tz::Asia__Kolkata, ZoneSource::Contact));
        assert_eq!(rule.explain(None), (Tz::Europe__Berlin, ZoneSource::Default));
        assert_eq!(rule.explain(Some("")), (Tz::Europe__Berlin, ZoneSource::Default));
        assert_eq!(rule.explain(Some("+05:30")), (Tz::Europe__Berlin, ZoneSource::Invalid));
        assert_eq!(rule.explain(Some("Mars/Olympus")), (Tz::Europe__Berlin, ZoneSource::Invalid));
    }
}
