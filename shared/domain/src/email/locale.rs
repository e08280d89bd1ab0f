//! Locales of authored content: BCP 47 language tags, and which variant a contact reads.
//! Pure: a template, a partial and a layout each hold a default variant and variants by tag;
//! a send picks one tag for the whole mail ([`pick`]) and renders every part in it.

/// A language tag in its canonical case (`pt-BR`, `zh-Hant-TW`, `ar`), or `None` when `tag`
/// is not one. Accepts what contact data tends to hold: any case and `_` for `-` (`pt_br`).
/// The subset of BCP 47 accepted: a language of 2–3 letters, an optional script of 4
/// letters, an optional region of 2 letters or 3 digits, then variants of 5–8 letters or
/// digits (or 4 starting with a digit). Extensions and private use are not.
pub fn normalize(tag: &str) -> Option<String> {
    let tag = tag.trim();
    if tag.is_empty() || tag.len() > 35 {
        return None;
    }
    let mut parts = tag.split(['-', '_']);
    let language = parts.next()?;
    if !(2..=3).contains(&language.len()) || !language.bytes().all(|b| b.is_ascii_alphabetic()) {
        return None;
    }
    let mut out = language.to_ascii_lowercase();
    // 0: a script may follow, 1: a region may follow, 2: only variants.
    let mut stage = 0;
    for part in parts {
        let (len, alpha, digit) =
            (part.len(), part.bytes().all(|b| b.is_ascii_alphabetic()), part.bytes().all(|b| b.is_ascii_digit()));
        out.push('-');
        if stage == 0 && len == 4 && alpha {
            let mut chars = part.chars();
            out.extend(chars.next().map(|c| c.to_ascii_uppercase()));
            out.push_str(&chars.as_str().to_ascii_lowercase());
            stage = 1;
        } else if stage <= 1 && ((len == 2 && alpha) || (len == 3 && digit)) {
            out.push_str(&part.to_ascii_uppercase());
            stage = 2;
        } else if ((5..=8).contains(&len) || (len == 4 && part.as_bytes()[0].is_ascii_digit()))
            && part.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            out.push_str(&part.to_ascii_lowercase());
            stage = 2;
        } else {
            return None;
        }
    }
    Some(out)
}

/// The language subtag of a canonical tag: `pt` of `pt-BR`.
pub fn language(tag: &str) -> &str {
    tag.split('-').next().unwrap_or(tag)
}

/// Where the locale a contact reads came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matched {
    /// A variant has the contact's tag.
    Exact,
    /// A variant has the contact's language (`pt` for `pt-BR`).
    Language,
    /// The content's default: no variant matched, or the contact has no locale.
    Default,
}

impl Matched {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Language => "language",
            Self::Default => "default",
        }
    }
}

/// The variant tag a reader of `wanted` gets from content whose default variant is `default`
/// and whose other variants are `variants` (all canonical): the exact tag, else its
/// language, else the default.
pub fn pick<'a>(
    wanted: Option<&str>,
    default: &'a str,
    variants: impl IntoIterator<Item = &'a str>,
) -> (&'a str, Matched) {
    let Some(wanted) = wanted else { return (default, Matched::Default) };
    let mut by_language = None;
    for tag in std::iter::once(default).chain(variants) {
        if tag == wanted {
            return (tag, Matched::Exact);
        }
        if by_language.is_none() && tag == language(wanted) {
            by_language = Some(tag);
        }
    }
    match by_language {
        Some(tag) => (tag, Matched::Language),
        None => (default, Matched::Default),
    }
}

/// Languages written right to left (the language subtag), unless a script says otherwise.
const RIGHT_TO_LEFT: &[&str] = &["ar", "arc", "ckb", "dv", "fa", "he", "iw", "ks", "ps", "sd", "ug", "ur", "yi"];
const RIGHT_TO_LEFT_SCRIPTS: &[&str] = &["Arab", "Hebr", "Syrc", "Thaa", "Nkoo", "Adlm", "Rohg"];

/// Whether text in `tag` runs right to left: `rtl` or `ltr`, the HTML `dir` value.
pub fn direction(tag: &str) -> &'static str {
    let script = tag.split('-').nth(1).filter(|part| part.len() == 4 && part.bytes().all(|b| b.is_ascii_alphabetic()));
    let rtl = match script {
        Some(script) => RIGHT_TO_LEFT_SCRIPTS.contains(&script),
        None => RIGHT_TO_LEFT.contains(&language(tag)),
    };
    if rtl { "rtl" } else { "ltr" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_held_to_bcp47_and_put_in_their_canonical_case() {
        assert_eq!(normalize("pt_br").as_deref(), Some("pt-BR"));
        assert_eq!(normalize(" DE ").as_deref(), Some("de"));
        assert_eq!(normalize("zh-hant-tw").as_deref(), Some("zh-Hant-TW"));
        assert_eq!(normalize("es-419").as_deref(), Some("es-419"));
        assert_eq!(normalize("sl-rozaj").as_deref(), Some("sl-rozaj"));
        for bad in ["", "e", "english", "en--US", "en-", "fr-FRA", "12", "de-DE-x-private", "ar\u{0660}"] {
            assert_eq!(normalize(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_reader_gets_the_exact_tag_then_the_language_then_the_default() {
        let variants = ["fr", "pt-BR", "pt", "de-AT"];
        assert_eq!(pick(Some("pt-BR"), "en", variants), ("pt-BR", Matched::Exact));
        assert_eq!(pick(Some("pt-PT"), "en", variants), ("pt", Matched::Language));
        assert_eq!(pick(Some("fr-CA"), "en", variants), ("fr", Matched::Language));
        // A regional variant is not the language's: `de` finds no `de` variant.
        assert_eq!(pick(Some("de"), "en", variants), ("en", Matched::Default));
        assert_eq!(pick(Some("ja"), "en", variants), ("en", Matched::Default));
        assert_eq!(pick(None, "en", variants), ("en", Matched::Default));
        // The default's own tag is matched like any variant.
        assert_eq!(pick(Some("en-GB"), "en", variants), ("en", Matched::Language));
        assert_eq!(pick(Some("en"), "en", variants), ("en", Matched::Exact));
    }

    #[test]
    fn arabic_hebrew_and_persian_run_right_to_left_unless_their_script_does_not() {
        for tag in ["ar", "ar-EG", "he", "fa-IR", "ur", "az-Arab"] {
            assert_eq!(direction(tag), "rtl", "{tag}");
        }
        for tag in ["en", "de", "ja", "az-Latn", "pa", "ku-Latn"] {
            assert_eq!(direction(tag), "ltr", "{tag}");
        }
    }
}
