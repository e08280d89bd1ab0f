//! Click and open tracking, pure. Before an email's content is sealed, the links of its HTML
//! part are rewritten to signed links under the public base URL that redirect to the
//! original target ([`rewrite`]), and a one-pixel image whose fetch is an open is added
//! at the end of the body. A link carries its target in the clear, its position among the
//! email's tracked links (`n`, from 1: what per-link results count by, the same for every
//! recipient of a template whatever their rendered targets) and a keyed MAC over the email,
//! the target and the position ([`Links::click`]), so following one needs no database read,
//! and a link the system did not issue (another target, another email, another position, a
//! changed or truncated signature) never redirects ([`Links::verify_click`]): there is no
//! open redirect. Links sent before positions were numbered carry none and still check.
//!
//! Keys are numbered and derived from the master key; a link names the number of the key
//! that signed it, so rotating to a new number leaves the links already sent working while
//! the old number is still accepted.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{KeyInit, Mac};
use lol_html::html_content::ContentType;
use lol_html::{RewriteStrSettings, element, rewrite_str};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::render::escape_html;

type Hmac = hmac::Hmac<sha2::Sha256>;

/// What a URL component escapes: all but the unreserved characters (RFC 3986).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Bytes of the MAC a link carries: 128 bits, beyond guessing.
const TAG_BYTES: usize = 16;

/// The attribute that keeps a link as authored (`<a href="…" data-track="false">`); removed
/// from what is sent.
pub const SKIP_ATTRIBUTE: &str = "data-track";

/// One numbered link key.
#[derive(Clone)]
struct LinkKey {
    number: u32,
    secret: [u8; 32],
}

/// The keys that sign and check tracking links: the one that signs new links, and the
/// numbers still accepted.
#[derive(Clone)]
pub struct Links {
    signing: LinkKey,
    accepted: Vec<LinkKey>,
}

/// What a link proves once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Issued by this system for this email (and, for a click, this target).
    Valid,
    /// Anything else: never redirected, never recorded.
    Forged,
}

impl Links {
    /// Keys made by `derive` (a key derived from the master key for a purpose): new links
    /// are signed with key `signing`, links of every number in `accepted` (and of `signing`)
    /// are checked.
    pub fn derive(derive: impl Fn(&str) -> [u8; 32], signing: u32, accepted: &[u32]) -> Self {
        let key = |number: u32| LinkKey { number, secret: derive(&format!("tracking-link-key-{number}")) };
        let mut numbers: Vec<u32> = accepted.iter().copied().filter(|number| *number != signing).collect();
        numbers.sort_unstable();
        numbers.dedup();
        Self { signing: key(signing), accepted: numbers.into_iter().map(key).collect() }
    }

    /// The keys the settings name (`TRACKING_KEY`, `TRACKING_KEYS_ACCEPTED`), derived from
    /// the master key.
    pub fn from_settings(keyring: &platform::crypto::Keyring, settings: &platform::settings::EmailSettings) -> Self {
        Self::derive(|purpose| keyring.derive_key(purpose), settings.tracking_key, &settings.tracking_keys_accepted)
    }

    /// The tracking link of `target`, the `position`th tracked link (from 1) of email
    /// `email_id`, under `base_url` (the public base URL, `…/v1`).
    pub fn click(&self, base_url: &str, email_id: &str, target: &str, position: u32) -> String {
        let signature = self.signature(&self.signing, "click", email_id, target, Some(position));
        format!(
            "{}/emails/{}/click?url={}&n={position}&sig={signature}",
            base_url.trim_end_matches('/'),
            utf8_percent_encode(email_id, COMPONENT),
            utf8_percent_encode(target, COMPONENT),
        )
    }

    /// The open pixel's URL of email `email_id`.
    pub fn open(&self, base_url: &str, email_id: &str) -> String {
        let signature = self.signature(&self.signing, "open", email_id, "", None);
        format!(
            "{}/emails/{}/open?sig={signature}",
            base_url.trim_end_matches('/'),
            utf8_percent_encode(email_id, COMPONENT)
        )
    }

    /// Whether `signature` is this system's for a click of `target` at `position` in email
    /// `email_id` (a link sent before positions were numbered has none).
    pub fn verify_click(&self, email_id: &str, target: &str, position: Option<u32>, signature: &str) -> Checked {
        self.verify("click", email_id, target, position, signature)
    }

    /// Whether `signature` is this system's for the open pixel of email `email_id`.
    pub fn verify_open(&self, email_id: &str, signature: &str) -> Checked {
        self.verify("open", email_id, "", None, signature)
    }

    /// `<number>.<MAC>`: the MAC (truncated HMAC-SHA256, base64url) over what the link is,
    /// the email, the target and the position if any, each length-prefixed so no two inputs
    /// share bytes.
    fn signature(&self, key: &LinkKey, what: &str, email_id: &str, target: &str, position: Option<u32>) -> String {
        let tag = mac(key, what, email_id, target, position).finalize().into_bytes();
        format!("{}.{}", key.number, URL_SAFE_NO_PAD.encode(&tag[..TAG_BYTES]))
    }

    fn verify(&self, what: &str, email_id: &str, target: &str, position: Option<u32>, signature: &str) -> Checked {
        let Some((number, tag)) = signature.split_once('.') else { return Checked::Forged };
        let Ok(number) = number.parse::<u32>() else { return Checked::Forged };
        let Some(key) = std::iter::once(&self.signing).chain(&self.accepted).find(|key| key.number == number) else {
            return Checked::Forged;
        };
        let Ok(tag) = URL_SAFE_NO_PAD.decode(tag) else { return Checked::Forged };
        if tag.len() != TAG_BYTES {
            return Checked::Forged;
        }
        // Compared in constant time.
        match mac(key, what, email_id, target, position).verify_truncated_left(&tag) {
            Ok(()) => Checked::Valid,
            Err(_) => Checked::Forged,
        }
    }
}

fn mac(key: &LinkKey, what: &str, email_id: &str, target: &str, position: Option<u32>) -> Hmac {
    let Ok(mut mac) = <Hmac as KeyInit>::new_from_slice(&key.secret) else {
        unreachable!("HMAC takes a key of any length")
    };
    let position = position.map(|position| position.to_string());
    for part in [what, email_id, target].into_iter().chain(position.as_deref()) {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part.as_bytes());
    }
    mac
}

/// What [`rewrite`] tracks.
#[derive(Debug, Clone, Copy)]
pub struct Track {
    pub clicks: bool,
    pub opens: bool,
}

/// `html` (an email's HTML part) with its links rewritten to tracking links of email
/// `email_id` and the open pixel before the end of its body (or at its end), as `track`
/// asks, numbered from 1 in document order. Left as authored (and not numbered): links that
/// are not `http(s)` (`mailto:`, `tel:`, anchors, relative links), links to the platform's
/// own pages under `base_url` (the unsubscribe and preference links), and links marked
/// `data-track="false"`. Entities in `href` are
/// decoded: `&amp;` in the markup is `&` in the target. HTML that does not parse as far as
/// the rewriter needs is returned unchanged (an email is never refused for its markup).
pub fn rewrite(html: &str, email_id: &str, base_url: &str, links: &Links, track: Track) -> String {
    if !track.clicks && !track.opens {
        return html.to_owned();
    }
    let own = base_url.trim_end_matches('/');
    let mut saw_body = false;
    let mut numbered = 0u32;
    let pixel = track.opens.then(|| {
        format!(
            "<img src=\"{}\" width=\"1\" height=\"1\" alt=\"\" style=\"display:block;width:1px;height:1px;border:0\">",
            escape_html(&links.open(base_url, email_id))
        )
    });
    let settings = RewriteStrSettings::new()
        .append_element_content_handler(element!("a[href]", |element| {
            let skip = element.get_attribute(SKIP_ATTRIBUTE).is_some_and(|value| value.eq_ignore_ascii_case("false"));
            element.remove_attribute(SKIP_ATTRIBUTE);
            if skip || !track.clicks {
                return Ok(());
            }
            let Some(raw) = element.get_attribute("href") else { return Ok(()) };
            let target = html_escape::decode_html_entities(raw.trim()).into_owned();
            if is_tracked(&target, own) {
                numbered += 1;
                element.set_attribute("href", &escape_html(&links.click(base_url, email_id, &target, numbered)))?;
            }
            Ok(())
        }))
        .append_element_content_handler(element!("body", |element| {
            saw_body = true;
            if let Some(pixel) = &pixel {
                element.append(pixel, ContentType::Html);
            }
            Ok(())
        }));
    let rewritten = rewrite_str(html, settings);
    match (rewritten, &pixel) {
        (Ok(rewritten), Some(pixel)) if !saw_body => format!("{rewritten}\n{pixel}"),
        (Ok(rewritten), _) => rewritten,
        (Err(_), _) => html.to_owned(),
    }
}

/// The longest target a tracking link carries (bytes); a longer link is left as written, so a
/// tracking link stays within what servers and proxies take in a request line.
pub const MAX_TARGET_BYTES: usize = 2_000;

/// Whether a link's target is one to track: an absolute `http(s)` URL of at most
/// [`MAX_TARGET_BYTES`] that is not one of the platform's own (`own`: the public base URL).
fn is_tracked(target: &str, own: &str) -> bool {
    if target.len() > MAX_TARGET_BYTES {
        return false;
    }
    let lowercase = target.to_ascii_lowercase();
    let absolute = lowercase.starts_with("https://") || lowercase.starts_with("http://");
    absolute && !target.starts_with(own)
}

/// What escapes in a redirect's `Location`: controls, the space and, as always, every
/// non-ASCII byte; the rest of the target is sent as the email had it.
const LOCATION: &AsciiSet = &percent_encoding::CONTROLS.add(b' ').add(b'"').add(b'<').add(b'>');

/// A verified target as a `Location` header value: a target written with non-ASCII
/// characters or spaces (which browsers follow, encoding them) is percent-encoded, so the
/// header is always valid.
pub fn redirect_location(target: &str) -> String {
    utf8_percent_encode(target, LOCATION).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    const BASE: &str = "https://mail.example.test/v1";

    fn links(signing: u32, accepted: &[u32]) -> Links {
        Links::derive(|purpose| sha2::Sha256::digest(purpose.as_bytes()).into(), signing, accepted)
    }

    fn query(link: &str, name: &str) -> Option<String> {
        let url = url::Url::parse(link).ok()?;
        url.query_pairs().find(|(key, _)| key == name).map(|(_, value)| value.into_owned())
    }

    fn track() -> Track {
        Track { clicks: true, opens: true }
    }

    #[test]
    fn given_a_link_when_rewritten_then_it_carries_the_decoded_target_and_a_signature_that_checks() {
        let keys = links(1, &[]);
        let html = r#"<p><a href="https://shop.example.test/p?a=1&amp;b=2">Buy</a></p>"#;
        let out = rewrite(html, "em_1", BASE, &keys, Track { clicks: true, opens: false });
        let start = out.find("href=\"").expect("a link") + 6;
        let href = html_escape::decode_html_entities(&out[start..start + out[start..].find('"').expect("closed")])
            .into_owned();
        assert!(href.starts_with("https://mail.example.test/v1/emails/em_1/click?url="), "{href}");
        let target = query(&href, "url").expect("a target");
        assert_eq!(target, "https://shop.example.test/p?a=1&b=2", "entities are decoded before signing");
        let signature = query(&href, "sig").expect("a signature");
        assert_eq!(query(&href, "n").as_deref(), Some("1"), "the first tracked link");
        assert_eq!(keys.verify_click("em_1", &target, Some(1), &signature), Checked::Valid);
        assert!(out.ends_with(">Buy</a></p>"), "{out}");
    }

    #[test]
    fn given_several_links_when_rewritten_then_tracked_ones_are_numbered_in_document_order() {
        let keys = links(1, &[]);
        let html = concat!(
            r#"<a href="https://a.test/">A</a><a href="mailto:x@a.test">M</a>"#,
            r#"<a href="https://a.test/" data-track="false">Kept</a><a href="https://b.test/">B</a>"#,
            r#"<a href="https://a.test/">A again</a>"#,
        );
        let out = rewrite(html, "em_1", BASE, &keys, Track { clicks: true, opens: false });
        let numbers: Vec<(String, String)> = out
            .split("href=\"")
            .skip(1)
            .filter_map(|rest| {
                let href = html_escape::decode_html_entities(&rest[..rest.find('"')?]).into_owned();
                Some((query(&href, "url")?, query(&href, "n")?))
            })
            .collect();
        let expected = [("https://a.test/", "1"), ("https://b.test/", "2"), ("https://a.test/", "3")];
        assert_eq!(
            numbers,
            expected.map(|(url, n)| (url.to_owned(), n.to_owned())).to_vec(),
            "a repeated target is a link of its own; skipped links take no number"
        );
    }

    #[test]
    fn given_a_link_sent_before_positions_when_checked_then_it_still_redirects_and_no_position_can_be_added() {
        let keys = links(1, &[]);
        let old = keys.signature(&keys.signing, "click", "em_1", "https://shop.example.test/", None);
        assert_eq!(keys.verify_click("em_1", "https://shop.example.test/", None, &old), Checked::Valid);
        assert_eq!(keys.verify_click("em_1", "https://shop.example.test/", Some(1), &old), Checked::Forged);
        let new = query(&keys.click(BASE, "em_1", "https://shop.example.test/", 2), "sig").expect("a signature");
        assert_eq!(keys.verify_click("em_1", "https://shop.example.test/", Some(3), &new), Checked::Forged);
        assert_eq!(keys.verify_click("em_1", "https://shop.example.test/", None, &new), Checked::Forged);
    }

    #[test]
    fn given_any_change_to_a_link_when_checked_then_it_is_forged() {
        let keys = links(1, &[]);
        let link = keys.click(BASE, "em_1", "https://shop.example.test/", 1);
        let signature = query(&link, "sig").expect("a signature");
        assert_eq!(keys.verify_click("em_1", "https://shop.example.test/", Some(1), &signature), Checked::Valid);
        assert_eq!(
            keys.verify_click("em_1", "https://evil.example.test/", Some(1), &signature),
            Checked::Forged,
            "another target"
        );
        assert_eq!(
            keys.verify_click("em_2", "https://shop.example.test/", Some(1), &signature),
            Checked::Forged,
            "another email"
        );
        let truncated = &signature[..signature.len() - 2];
        assert_eq!(
            keys.verify_click("em_1", "https://shop.example.test/", Some(1), truncated),
            Checked::Forged,
            "truncated"
        );
        let mut changed = signature.clone().into_bytes();
        let last = changed.len() - 1;
        changed[last] = if changed[last] == b'A' { b'B' } else { b'A' };
        let changed = String::from_utf8(changed).expect("ascii");
        assert_eq!(
            keys.verify_click("em_1", "https://shop.example.test/", Some(1), &changed),
            Checked::Forged,
            "changed"
        );
        for nonsense in ["", "1", "1.", ".abc", "x.abc", "99.AAAAAAAAAAAAAAAAAAAAAA", "1.!!!"] {
            assert_eq!(
                keys.verify_click("em_1", "https://shop.example.test/", Some(1), nonsense),
                Checked::Forged,
                "{nonsense}"
            );
        }
        let open = query(&keys.open(BASE, "em_1"), "sig").expect("a signature");
        assert_eq!(keys.verify_open("em_1", &open), Checked::Valid);
        assert_eq!(keys.verify_open("em_2", &open), Checked::Forged);
        assert_eq!(keys.verify_click("em_1", "", None, &open), Checked::Forged, "an open's signature is no click's");
    }

    #[test]
    fn given_a_rotation_when_checked_then_old_links_work_while_their_key_is_accepted() {
        let before = links(1, &[]);
        let link = before.click(BASE, "em_1", "https://shop.example.test/", 1);
        let signature = query(&link, "sig").expect("a signature");
        let rotated = links(2, &[1]);
        assert!(
            query(&rotated.click(BASE, "em_1", "https://shop.example.test/", 1), "sig").expect("sig").starts_with("2.")
        );
        assert_eq!(rotated.verify_click("em_1", "https://shop.example.test/", Some(1), &signature), Checked::Valid);
        let retired = links(2, &[]);
        assert_eq!(retired.verify_click("em_1", "https://shop.example.test/", Some(1), &signature), Checked::Forged);
    }

    #[test]
    fn given_links_that_are_not_for_tracking_when_rewritten_then_they_stay_as_authored() {
        let keys = links(1, &[]);
        let html = concat!(
            r##"<a href="mailto:help@example.test">Mail</a><a href="tel:+100">Call</a><a href="#top">Top</a>"##,
            r#"<a href="/relative">Rel</a><a href="https://mail.example.test/v1/emails/em_1/unsubscribe">Leave</a>"#,
            r#"<a href="https://shop.example.test/" data-track="false">Kept</a>"#,
        );
        let out = rewrite(html, "em_1", BASE, &keys, Track { clicks: true, opens: false });
        assert_eq!(
            out,
            concat!(
                r##"<a href="mailto:help@example.test">Mail</a><a href="tel:+100">Call</a><a href="#top">Top</a>"##,
                r#"<a href="/relative">Rel</a><a href="https://mail.example.test/v1/emails/em_1/unsubscribe">Leave</a>"#,
                r#"<a href="https://shop.example.test/">Kept</a>"#,
            )
        );
    }

    #[test]
    fn given_a_document_or_a_fragment_when_opens_are_tracked_then_the_pixel_ends_the_body() {
        let keys = links(1, &[]);
        let document = rewrite("<html><body><p>Hi</p></body></html>", "em_1", BASE, &keys, track());
        assert!(
            document.contains("<p>Hi</p><img src=\"https://mail.example.test/v1/emails/em_1/open?sig=1."),
            "{document}"
        );
        assert!(document.ends_with("\"></body></html>"), "{document}");
        let fragment = rewrite("<p>Hi</p>", "em_1", BASE, &keys, track());
        assert!(fragment.starts_with("<p>Hi</p>\n<img src="), "{fragment}");
        let untracked = rewrite(
            "<p><a href=\"https://a.test/\">A</a></p>",
            "em_1",
            BASE,
            &keys,
            Track { clicks: false, opens: false },
        );
        assert_eq!(untracked, "<p><a href=\"https://a.test/\">A</a></p>");
    }

    #[test]
    fn a_redirect_location_is_always_a_valid_header() {
        assert_eq!(redirect_location("https://a.example/x?y=1&z=%20"), "https://a.example/x?y=1&z=%20");
        assert_eq!(redirect_location("https://a.example/ça va"), "https://a.example/%C3%A7a%20va");
        assert_eq!(redirect_location("https://a.example/\r\nSet-Cookie: x"), "https://a.example/%0D%0ASet-Cookie:%20x");
    }

    #[test]
    fn a_link_longer_than_a_tracking_link_may_carry_is_left_as_written() {
        let links = Links::derive(|_| [3; 32], 1, &[]);
        let long = format!("https://a.example/{}", "x".repeat(MAX_TARGET_BYTES));
        let html = format!("<a href=\"{long}\">Long</a>");
        let track = Track { clicks: true, opens: false };
        assert_eq!(rewrite(&html, "em_1", "https://api.example.test/v1", &links, track), html);
    }
}
