//! The words of the pages a recipient sees (the preference page, the pages after leaving a
//! topic or everything, a form's thanks and its confirmation), in the recipient's locale.
//! Every sentence has a key and the platform's English; a space gives its own per locale in
//! the workspace file (`pageText`), key by key, and the English stands for any key it does
//! not give. A sentence may name values in braces (`{topic}`), each key its own.

use std::collections::BTreeMap;

use crate::email::locale;
use crate::email::resources::{PAGE_FALLBACK_LOCALE, PageTextDef, TopicDef};

/// One sentence of the pages: its key, the platform's English and the values it may name.
pub struct Entry {
    pub key: &'static str,
    pub english: &'static str,
    pub placeholders: &'static [&'static str],
}

const fn entry(key: &'static str, english: &'static str, placeholders: &'static [&'static str]) -> Entry {
    Entry { key, english, placeholders }
}

/// Every sentence of the recipient pages.
pub const ENTRIES: &[Entry] = &[
    entry("parties.fromTo", "Email from {sender} to {recipient}.", &["sender", "recipient"]),
    entry("parties.from", "Email from {sender}.", &["sender"]),
    entry("parties.to", "Email to {recipient}.", &["recipient"]),
    entry("sender.unknown", "this sender", &[]),
    entry("preferences.title", "Email preferences", &[]),
    entry("preferences.thisTopic", "This email was sent to you as part of {topic}.", &["topic"]),
    entry("preferences.leaveTopic", "Unsubscribe from {topic}", &["topic"]),
    entry("preferences.marketingQuestion", "Stop receiving marketing email like this one?", &[]),
    entry("preferences.leaveMarketing", "Unsubscribe from marketing email", &[]),
    entry("preferences.subscriptions", "Your subscriptions", &[]),
    entry("preferences.subscribed", "Subscribed", &[]),
    entry("preferences.notSubscribed", "Not subscribed", &[]),
    entry("preferences.save", "Save my preferences", &[]),
    entry("preferences.leaveAllQuestion", "Or leave everything: no more marketing email of any topic.", &[]),
    entry("preferences.leaveAll", "Unsubscribe from all", &[]),
    entry("preferences.leftTopic", "You are not subscribed to {topic}.", &["topic"]),
    entry("preferences.leftMarketing", "You are unsubscribed from marketing email.", &[]),
    entry("unsubscribed.title", "You are unsubscribed", &[]),
    entry("unsubscribed.topic", "You will no longer receive emails about {topic}.", &["topic"]),
    entry("unsubscribed.marketing", "You will no longer receive marketing email from {sender}.", &["sender"]),
    entry("unsubscribed.link", "Change your other email preferences", &[]),
    entry("saved.title", "Your preferences are saved", &[]),
    entry("saved.none", "You are not subscribed to any topic.", &[]),
    entry("saved.some", "You are subscribed to: {topics}.", &["topics"]),
    entry("saved.leftAllTitle", "You are unsubscribed from everything", &[]),
    entry("saved.link", "Back to your email preferences", &[]),
    entry("form.pending", "Thank you. Please check your inbox and follow the link to confirm.", &[]),
    entry("form.subscribed", "Thank you. You are subscribed.", &[]),
    entry("form.confirmed", "Your subscription is confirmed. Thank you.", &[]),
];

/// The longest sentence a space may give.
pub const MAX_TEXT_CHARS: usize = 500;

fn entry_of(key: &str) -> Option<&'static Entry> {
    ENTRIES.iter().find(|entry| entry.key == key)
}

/// The values a sentence names, in the order written (`{topic}` → `topic`); `Err` for an
/// opening brace that is never closed.
fn named(text: &str) -> Result<Vec<&str>, ()> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        let end = after.find('}').ok_or(())?;
        names.push(&after[..end]);
        rest = &after[end + 1..];
    }
    Ok(names)
}

/// Why a space's sentences for one locale cannot be used: an unknown key, an empty or too
/// long sentence, or a value in braces the key does not name. `None` when all are usable.
pub fn check(given: &BTreeMap<String, String>) -> Option<String> {
    for (key, text) in given {
        let Some(entry) = entry_of(key) else {
            let keys: Vec<&str> = ENTRIES.iter().map(|entry| entry.key).collect();
            return Some(format!("{key:?} is no page text key; the keys are {}", keys.join(", ")));
        };
        if text.trim().is_empty() {
            return Some(format!("{key:?} is empty"));
        }
        if text.chars().count() > MAX_TEXT_CHARS {
            return Some(format!("{key:?} is longer than {MAX_TEXT_CHARS} characters"));
        }
        let Ok(names) = named(text) else {
            return Some(format!("{key:?} opens a brace it does not close"));
        };
        if let Some(unknown) = names.iter().find(|name| !entry.placeholders.contains(name)) {
            let known = match entry.placeholders {
                [] => "none".to_owned(),
                names => names.iter().map(|name| format!("{{{name}}}")).collect::<Vec<_>>().join(", "),
            };
            return Some(format!("{key:?} names {{{unknown}}}, which it does not have (it has: {known})"));
        }
    }
    None
}

/// The page text of one locale: the space's sentences where it gives them, else the
/// platform's English.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageText {
    lang: String,
    given: BTreeMap<String, String>,
}

impl Default for PageText {
    fn default() -> Self {
        Self { lang: PAGE_FALLBACK_LOCALE.to_owned(), given: BTreeMap::new() }
    }
}

impl PageText {
    /// The text for a reader of `wanted` (the email's locale, or the contact's), by the chain
    /// of [`PageTextDef::locale_for`].
    pub fn of(def: &PageTextDef, wanted: Option<&str>) -> Self {
        let lang = def.locale_for(wanted).to_owned();
        let given = def.text_of(&lang).cloned().unwrap_or_default();
        Self { lang, given }
    }

    /// The tag the page says it is in (`<html lang>`).
    pub fn lang(&self) -> &str {
        &self.lang
    }

    /// `rtl` for a language written right to left, else `ltr` (`<html dir>`).
    pub fn dir(&self) -> &'static str {
        locale::direction(&self.lang)
    }

    /// The sentence of `key`, its values still in braces.
    pub fn get<'a>(&'a self, key: &'a str) -> &'a str {
        match self.given.get(key) {
            Some(text) => text,
            None => entry_of(key).map_or(key, |entry| entry.english),
        }
    }

    /// The sentence of `key` with its values filled in, in one pass: a value that itself
    /// holds braces (a sender named `{recipient}`) is shown as it is.
    pub fn fill(&self, key: &str, values: &[(&str, &str)]) -> String {
        let mut text = String::new();
        let mut rest = self.get(key);
        while let Some(start) = rest.find('{') {
            let after = &rest[start + 1..];
            let value = after
                .find('}')
                .and_then(|end| values.iter().find(|(name, _)| *name == &after[..end]).map(|(_, value)| (end, value)));
            match value {
                Some((end, value)) => {
                    text.push_str(&rest[..start]);
                    text.push_str(value);
                    rest = &after[end + 1..];
                }
                None => {
                    text.push_str(&rest[..=start]);
                    rest = after;
                }
            }
        }
        text.push_str(rest);
        text
    }

    /// "Email from S to a***@example.com." as far as either is known. Each value is isolated
    /// (U+2068 … U+2069, the plain-text `<bdi>`), so a name or an address in the other
    /// direction from the sentence's keeps its own order and does not pull the words around
    /// it: an address in an Arabic sentence, an Arabic name in an English one.
    pub fn parties(&self, sender: Option<&str>, recipient: Option<&str>) -> Option<String> {
        let (sender, recipient) = (sender.map(isolate), recipient.map(isolate));
        let (sender, recipient) = (sender.as_deref(), recipient.as_deref());
        match (sender, recipient) {
            (None, None) => None,
            (Some(sender), Some(recipient)) => {
                Some(self.fill("parties.fromTo", &[("sender", sender), ("recipient", recipient)]))
            }
            (Some(sender), None) => Some(self.fill("parties.from", &[("sender", sender)])),
            (None, Some(recipient)) => Some(self.fill("parties.to", &[("recipient", recipient)])),
        }
    }

    /// A topic's name and description in this locale.
    pub fn topic<'a>(&self, topic: &'a TopicDef) -> (&'a str, Option<&'a str>) {
        topic.in_locale(&self.lang)
    }
}

/// `value` as a first-strong isolate: U+2068 before it, U+2069 after.
fn isolate(value: &str) -> String {
    format!("\u{2068}{value}\u{2069}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(locales: &[(&str, &[(&str, &str)])], default: Option<&str>) -> PageTextDef {
        PageTextDef {
            locale_attribute: Some("language".to_owned()),
            default_locale: default.map(str::to_owned),
            locales: locales
                .iter()
                .map(|(tag, text)| {
                    let text = text.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect();
                    ((*tag).to_owned(), text)
                })
                .collect(),
        }
    }

    #[test]
    fn every_key_is_unique_and_its_english_names_only_its_values() {
        let mut keys: Vec<&str> = ENTRIES.iter().map(|entry| entry.key).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), ENTRIES.len());
        for entry in ENTRIES {
            let given = BTreeMap::from([(entry.key.to_owned(), entry.english.to_owned())]);
            assert_eq!(check(&given), None, "{}", entry.key);
            let mut names = named(entry.english).expect("closed braces");
            names.sort_unstable();
            let mut declared = entry.placeholders.to_vec();
            declared.sort_unstable();
            assert_eq!(names, declared, "{}", entry.key);
        }
    }

    #[test]
    fn the_workspace_file_guide_lists_every_key_with_its_english() {
        let guide = include_str!("../../../../docs/workspace-file.md");
        for entry in ENTRIES {
            let row = format!("| `{}` | {} |", entry.key, entry.english);
            assert!(guide.contains(&row), "docs/workspace-file.md lacks the row {row}");
        }
    }

    #[test]
    fn the_demo_speaks_every_sentence_in_each_of_its_languages() {
        let demo: serde_json::Value =
            serde_json::from_str(include_str!("../../../../deploy/demo-workspace.json")).expect("the demo is JSON");
        let spaces = demo["spaces"].as_array().expect("spaces");
        let text = spaces.iter().find_map(|space| space["pageText"].as_object()).expect("the demo gives page text");
        for (tag, given) in text {
            let given: BTreeMap<String, String> = serde_json::from_value(given.clone()).expect("key to text");
            assert_eq!(check(&given), None, "{tag}");
            let missing: Vec<&str> =
                ENTRIES.iter().map(|entry| entry.key).filter(|key| !given.contains_key(*key)).collect();
            assert!(missing.is_empty(), "the demo's {tag} lacks {missing:?}: its pages would mix in English");
        }
    }

    #[test]
    fn a_space_text_is_refused_for_an_unknown_key_an_unknown_value_or_an_open_brace() {
        let one = |key: &str, text: &str| check(&BTreeMap::from([(key.to_owned(), text.to_owned())]));
        assert!(one("preferences.titel", "x").is_some_and(|why| why.contains("no page text key")));
        let wrong = one("preferences.leaveTopic", "Abmelden von {thema}").expect("refused");
        assert!(wrong.contains("{thema}") && wrong.contains("{topic}"), "{wrong}");
        assert!(one("preferences.title", "{topic}").is_some_and(|why| why.contains("it has: none")));
        assert!(one("preferences.leaveTopic", "Abmelden von {topic").is_some());
        assert!(one("preferences.title", "  ").is_some());
        assert!(one("preferences.title", &"x".repeat(MAX_TEXT_CHARS + 1)).is_some());
        assert_eq!(one("preferences.leaveTopic", "Abmelden von {topic}"), None);
    }

    #[test]
    fn the_locale_follows_the_chain_and_english_stands_for_what_is_not_given() {
        let space = def(&[("de", &[("preferences.title", "E-Mail-Einstellungen")]), ("ar", &[])], Some("de"));
        let german = PageText::of(&space, Some("de-AT"));
        assert_eq!((german.lang(), german.dir()), ("de", "ltr"));
        assert_eq!(german.get("preferences.title"), "E-Mail-Einstellungen");
        assert_eq!(german.get("preferences.save"), "Save my preferences");
        assert_eq!(PageText::of(&space, Some("ar")).dir(), "rtl");
        // No text of the reader's language: the space's default.
        assert_eq!(PageText::of(&space, Some("fr")).lang(), "de");
        assert_eq!(PageText::of(&space, None).lang(), "de");
        // A space without a default that has text of its own: English.
        let no_default = def(&[("de", &[])], None);
        assert_eq!(PageText::of(&no_default, Some("ja")).lang(), "en");
        assert_eq!(PageText::of(&PageTextDef::default(), Some("de")).get("preferences.title"), "Email preferences");
        let filled = german.fill("preferences.leaveTopic", &[("topic", "News")]);
        assert_eq!(filled, "Unsubscribe from News");
        assert_eq!(german.parties(Some("Acme"), None).as_deref(), Some("Email from \u{2068}Acme\u{2069}."));
        // Values are filled in one pass: one that holds braces stays as it is.
        let odd = german.parties(Some("{recipient}"), Some("a***@example.com"));
        assert_eq!(odd.as_deref(), Some("Email from \u{2068}{recipient}\u{2069} to \u{2068}a***@example.com\u{2069}."));
        assert_eq!(german.fill("preferences.leaveTopic", &[]), "Unsubscribe from {topic}");
    }
}
