//! The visible unsubscribe link of marketing mail. `List-Unsubscribe` is for the mailbox
//! provider's button; a person reading the message needs a link in the body too (CAN-SPAM,
//! GDPR, and the bulk-sender rules of Gmail and Yahoo ask for both). A template places the
//! link itself with the Liquid variable [`UNSUBSCRIBE_VARIABLE`]; a part that does not show
//! it gets a footer with it. Pure: the send renders through [`add`] before the content is
//! sealed, so the log holds what is sent and a rebuilt message carries the same footer.

use crate::render::{Rendered, escape_html};

/// The Liquid variable that holds a marketing email's unsubscribe URL.
pub const UNSUBSCRIBE_VARIABLE: &str = "unsubscribeUrl";

/// The link's words, the same in both parts.
const LINK_TEXT: &str = "Unsubscribe or change your email preferences";

/// Adds the footer to each part of `rendered` that does not already show `url`.
/// `subscribed_to` says what the recipient subscribed to (a topic's name, or mail from the
/// sender). Decided per part: a template that places the link in its HTML only still gets it
/// in the text part, which some clients show instead. `postal` (the sender's name and postal
/// address on one line, CAN-SPAM) goes above the link in a footer, and into every part that
/// does not show it already, even one that places its own link.
pub fn add(rendered: &mut Rendered, url: &str, subscribed_to: &str, postal: Option<&str>) {
    // The HTML part renders the variable HTML-escaped; a URL without `&` reads the same.
    let html_has_link = rendered.html.contains(&escape_html(url)) || rendered.html.contains(url);
    let html_postal = postal.filter(|postal| !rendered.html.contains(&escape_html(postal)));
    if !html_has_link {
        rendered.html = html_with_footer(&rendered.html, url, subscribed_to, html_postal);
    } else if let Some(postal) = html_postal {
        rendered.html = html_with_paragraph(&rendered.html, &postal_paragraph(postal));
    }
    let text_postal = postal.filter(|postal| !rendered.text.contains(*postal));
    if !rendered.text.contains(url) {
        rendered.text = text_with_footer(&rendered.text, url, subscribed_to, text_postal);
    } else if let Some(postal) = text_postal {
        let body = rendered.text.trim_end_matches(['\r', '\n']);
        rendered.text = format!("{body}\n\n{}\n", postal.replace(['\r', '\n'], " "));
    }
}

/// The sender's name and postal address as the footer prints them, on one line.
pub fn postal_line(from_name: &str, address: &str) -> String {
    let address: Vec<&str> = address.lines().map(str::trim).filter(|line| !line.is_empty()).collect();
    format!("{}, {}", from_name.replace(['\r', '\n'], " "), address.join(", "))
}

fn postal_paragraph(postal: &str) -> String {
    format!("<p style=\"margin:24px 0 0;font-size:12px;line-height:1.5;color:#555555\">{}</p>", escape_html(postal))
}

/// `html` with the footer paragraph before its closing `</body>` (or `</html>` when it has no
/// body element), or appended to a fragment, so a whole document stays valid.
pub(crate) fn html_with_footer(html: &str, url: &str, subscribed_to: &str, postal: Option<&str>) -> String {
    let link = format!(
        "<p style=\"margin:24px 0 0;font-size:12px;line-height:1.5;color:#555555\">You receive this because you \
         subscribed to {}. <a href=\"{}\" style=\"color:#555555;text-decoration:underline\">{LINK_TEXT}</a></p>",
        escape_html(subscribed_to),
        escape_html(url),
    );
    let paragraph = match postal {
        Some(postal) => format!("{}\n{link}", postal_paragraph(postal)),
        None => link,
    };
    html_with_paragraph(html, &paragraph)
}

/// `html` with `paragraph` before its closing `</body>` (or `</html>`), or appended.
fn html_with_paragraph(html: &str, paragraph: &str) -> String {
    // ASCII lowercasing keeps every byte offset, so a position found in it is one in `html`.
    let lowercase = html.to_ascii_lowercase();
    match lowercase.rfind("</body>").or_else(|| lowercase.rfind("</html>")) {
        Some(at) => format!("{}{paragraph}\n{}", &html[..at], &html[at..]),
        None if html.is_empty() => paragraph.to_owned(),
        None => format!("{html}\n{paragraph}"),
    }
}

/// `text` with the footer after a blank line and the `-- ` separator of a signature.
pub(crate) fn text_with_footer(text: &str, url: &str, subscribed_to: &str, postal: Option<&str>) -> String {
    // A line break in an authored name must not split the footer's lines.
    let subscribed_to = subscribed_to.replace(['\r', '\n'], " ");
    let postal = postal.map(|postal| format!("{}\n", postal.replace(['\r', '\n'], " "))).unwrap_or_default();
    let footer =
        format!("-- \n{postal}You receive this because you subscribed to {subscribed_to}.\n{LINK_TEXT}: {url}\n");
    let body = text.trim_end_matches(['\r', '\n']);
    if body.is_empty() { footer } else { format!("{body}\n\n{footer}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "https://api.example.test/v1/emails/em_1/unsubscribe";

    #[test]
    fn the_html_footer_goes_before_the_closing_body_tag_whatever_its_case() {
        let html = "<html><body><p>News</p></BODY></html>";
        let footed = html_with_footer(html, URL, "News", None);
        let expected_link = format!("<a href=\"{URL}\" style=\"color:#555555;text-decoration:underline\">");
        assert!(footed.starts_with("<html><body><p>News</p><p style="), "{footed}");
        assert!(footed.ends_with("</a></p>\n</BODY></html>"), "{footed}");
        assert!(footed.contains(&expected_link), "{footed}");
        assert!(footed.contains("subscribed to News. <a"), "{footed}");
        assert_eq!(footed.matches("</BODY>").count(), 1);
    }

    #[test]
    fn the_html_footer_is_appended_to_a_fragment_and_goes_before_a_lone_closing_html_tag() {
        let footed = html_with_footer("<p>News</p>", URL, "News", None);
        assert!(footed.starts_with("<p>News</p>\n<p style="), "{footed}");
        assert!(footed.ends_with("Unsubscribe or change your email preferences</a></p>"), "{footed}");
        let document = html_with_footer("<html><p>News</p></html>", URL, "News", None);
        assert!(document.ends_with("</a></p>\n</html>"), "{document}");
        assert!(html_with_footer("", URL, "News", None).starts_with("<p style="));
    }

    #[test]
    fn what_the_html_footer_inserts_is_escaped() {
        let footed = html_with_footer("<p>x</p>", "https://e.test/?a=1&b=\"2\"", "<b>Tom & Jerry's</b>", None);
        assert!(footed.contains("subscribed to &lt;b&gt;Tom &amp; Jerry&#39;s&lt;/b&gt;."), "{footed}");
        assert!(footed.contains("href=\"https://e.test/?a=1&amp;b=&quot;2&quot;\""), "{footed}");
        assert!(!footed.contains("<b>"), "{footed}");
    }

    #[test]
    fn the_text_footer_follows_a_blank_line_and_a_signature_separator() {
        assert_eq!(
            text_with_footer("News\n", URL, "News", None),
            format!(
                "News\n\n-- \nYou receive this because you subscribed to News.\n\
                 Unsubscribe or change your email preferences: {URL}\n"
            )
        );
        let broken = text_with_footer("", URL, "A\r\nBcc: x", None);
        assert!(broken.starts_with("-- \nYou receive this because you subscribed to A  Bcc: x.\n"), "{broken}");
    }

    #[test]
    fn a_part_that_shows_the_link_gets_no_footer_and_the_other_does() {
        let mut rendered = Rendered {
            subject: "S".to_owned(),
            html: format!("<p><a href=\"{URL}\">Leave</a></p>"),
            text: "News".to_owned(),
            ..Rendered::default()
        };
        add(&mut rendered, URL, "News", None);
        assert_eq!(rendered.html, format!("<p><a href=\"{URL}\">Leave</a></p>"));
        assert!(rendered.text.ends_with(&format!(": {URL}\n")), "{}", rendered.text);
        // An escaped URL in the HTML part counts as shown.
        let url = "https://e.test/?a=1&b=2";
        let mut escaped = Rendered {
            subject: String::new(),
            html: format!("<a href=\"{}\">x</a>", escape_html(url)),
            text: url.into(),
            ..Rendered::default()
        };
        let before = escaped.clone();
        add(&mut escaped, url, "News", None);
        assert_eq!(escaped, before);
    }

    #[test]
    fn the_senders_postal_address_is_in_every_part_once_even_where_the_template_placed_the_link() {
        let postal = postal_line("Example Team", "1 Main Street\nSpringfield, IL 62701\n");
        assert_eq!(postal, "Example Team, 1 Main Street, Springfield, IL 62701");
        let mut footed = Rendered { html: "<p>News</p>".into(), text: "News".into(), ..Rendered::default() };
        add(&mut footed, URL, "News", Some(&postal));
        assert!(footed.html.contains(&format!(">{postal}</p>\n<p style=")), "above the link: {}", footed.html);
        assert!(footed.text.contains(&format!("-- \n{postal}\nYou receive this")), "{}", footed.text);
        let mut linked = Rendered {
            subject: String::new(),
            html: format!("<p><a href=\"{URL}\">Leave</a></p>"),
            text: format!("Leave: {URL}"),
            ..Rendered::default()
        };
        add(&mut linked, URL, "News", Some(&postal));
        assert!(linked.html.ends_with(&format!("{postal}</p>")), "{}", linked.html);
        assert!(linked.text.ends_with(&format!("\n\n{postal}\n")), "{}", linked.text);
        let again = linked.clone();
        add(&mut linked, URL, "News", Some(&postal));
        assert_eq!(linked, again, "once");
    }
}
