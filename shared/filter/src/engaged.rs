//! Engagement facts: `opened` and `clicked` (see the crate documentation, "Engagement"): the
//! type, its JSON form, its checks, and its evaluation against a contact's opens and clicks.
//! Reading its phrases is the parser's (`parser/engaged.rs`), reading its JSON form
//! `json.rs`'s, its plain words `describe.rs`'s.

use serde_json::{Map, Value, json};

use crate::{MAX_FIELD_PATH_CHARS, MAX_VALUE_CHARS, MAX_WINDOW_SECONDS};

/// `opened ...` or `clicked ...`: the contact opened (or clicked a link in) an email of the
/// source, within the window ending at the evaluation time when there is one. A machine's
/// opens and clicks count only with `machines`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engaged {
    pub action: Action,
    pub source: Source,
    /// Clicks only: the link's target contains this text (case-insensitively).
    pub link_contains: Option<String>,
    /// The window ending at the evaluation time, in seconds; `None` for all time.
    pub within_seconds: Option<u64>,
    /// Whether opens and clicks flagged as a machine's count too.
    pub machines: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Opened,
    Clicked,
}

/// Which emails count: any, or those a broadcast, a template or a workflow (one step of it)
/// sent. The names are slugs as written, or ids once the caller resolved them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Any,
    Broadcast(String),
    Template(String),
    Workflow { workflow: String, step: Option<String> },
}

/// One open or click of a contact's email, as filters read it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Engagement {
    pub opened: bool,
    /// Unix milliseconds.
    pub at_ms: i64,
    pub machine: bool,
    pub template_id: String,
    /// Empty unless a broadcast sent the email.
    pub broadcast_id: String,
    /// Empty unless a workflow sent the email.
    pub workflow_id: String,
    pub step_id: String,
    /// A click's target (empty for an open, or when it can no longer be read).
    pub url: String,
}

impl Action {
    pub(crate) fn word(self) -> &'static str {
        match self {
            Action::Opened => "opened",
            Action::Clicked => "clicked",
        }
    }
}

impl Engaged {
    /// Whether `engagement` is one this fact counts, whenever it happened.
    fn counts_kind(&self, engagement: &Engagement) -> bool {
        let action = match self.action {
            Action::Opened => engagement.opened,
            Action::Clicked => !engagement.opened,
        };
        let source = match &self.source {
            Source::Any => true,
            Source::Broadcast(id) => engagement.broadcast_id == *id,
            Source::Template(id) => engagement.template_id == *id,
            Source::Workflow { workflow, step } => {
                engagement.workflow_id == *workflow && step.as_ref().is_none_or(|step| engagement.step_id == *step)
            }
        };
        let link =
            self.link_contains.as_ref().is_none_or(|text| engagement.url.to_lowercase().contains(&text.to_lowercase()));
        action && source && link && (self.machines || !engagement.machine)
    }

    fn window_ms(&self) -> Option<i64> {
        self.within_seconds.map(|seconds| i64::try_from(seconds.saturating_mul(1000)).unwrap_or(i64::MAX))
    }

    /// Whether one counted engagement lies in the window ending at `now_ms`.
    pub(crate) fn holds(&self, engagements: &[Engagement], now_ms: i64) -> bool {
        engagements.iter().filter(|engagement| self.counts_kind(engagement)).any(|engagement| {
            engagement.at_ms <= now_ms
                && self.window_ms().is_none_or(|window| engagement.at_ms > now_ms.saturating_sub(window))
        })
    }

    /// The moments after `now_ms` at which a counted engagement enters or leaves the window.
    pub(crate) fn changes(&self, engagements: &[Engagement], now_ms: i64) -> Option<i64> {
        engagements
            .iter()
            .filter(|engagement| self.counts_kind(engagement))
            .flat_map(|engagement| {
                let leaves = self.window_ms().map(|window| engagement.at_ms.saturating_add(window));
                [Some(engagement.at_ms), leaves].into_iter().flatten()
            })
            .filter(|&time| time > now_ms)
            .min()
    }

    pub(crate) fn to_json(&self) -> Value {
        let mut inner = Map::new();
        match &self.source {
            Source::Any => {}
            Source::Broadcast(id) => {
                inner.insert("from".to_owned(), json!({"broadcast": id}));
            }
            Source::Template(id) => {
                inner.insert("from".to_owned(), json!({"template": id}));
            }
            Source::Workflow { workflow, step } => {
                let mut from = Map::new();
                from.insert("workflow".to_owned(), json!(workflow));
                if let Some(step) = step {
                    from.insert("step".to_owned(), json!(step));
                }
                inner.insert("from".to_owned(), Value::Object(from));
            }
        }
        if let Some(text) = &self.link_contains {
            inner.insert("linkContains".to_owned(), json!(text));
        }
        if let Some(seconds) = self.within_seconds {
            inner.insert("withinSeconds".to_owned(), json!(seconds));
        }
        if self.machines {
            inner.insert("includeMachines".to_owned(), json!(true));
        }
        let mut outer = Map::new();
        outer.insert(self.action.word().to_owned(), Value::Object(inner));
        Value::Object(outer)
    }
}

/// Checks what the types leave open: names within bounds, a window within bounds, a link text
/// only on clicks.
pub(crate) fn checked(engaged: Engaged) -> Result<Engaged, String> {
    let names: Vec<&String> = match &engaged.source {
        Source::Any => Vec::new(),
        Source::Broadcast(id) | Source::Template(id) => vec![id],
        Source::Workflow { workflow, step } => std::iter::once(workflow).chain(step).collect(),
    };
    for name in names {
        if name.trim().is_empty() || name.chars().any(char::is_control) {
            return Err("an email's source needs a name".to_owned());
        }
        if name.chars().count() > MAX_FIELD_PATH_CHARS {
            return Err(format!("a source's name is longer than {MAX_FIELD_PATH_CHARS} characters"));
        }
    }
    if let Some(text) = &engaged.link_contains {
        if engaged.action == Action::Opened {
            return Err("`containing` is for clicked links".to_owned());
        }
        if text.is_empty() || text.chars().count() > MAX_VALUE_CHARS {
            return Err(format!("a link's text is from 1 to {MAX_VALUE_CHARS} characters"));
        }
    }
    if engaged.within_seconds.is_some_and(|seconds| !(1..=MAX_WINDOW_SECONDS).contains(&seconds)) {
        return Err(format!("a window is from 1 second to {MAX_WINDOW_SECONDS} seconds (ten years)"));
    }
    Ok(engaged)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        Facts, Filter, describe, engaged_parts, from_json, matches, matches_facts, next_change_ms, parse_plain,
    };

    fn parsed(text: &str) -> Filter {
        parse_plain(text).unwrap_or_else(|error| panic!("{text:?} should parse: {error}"))
    }

    fn engaged(action: Action, source: Source) -> Engaged {
        Engaged { action, source, link_contains: None, within_seconds: None, machines: false }
    }

    fn opened(source: Source) -> Filter {
        Filter::Engaged(engaged(Action::Opened, source))
    }

    fn clicked(link: Option<&str>, source: Source, within_seconds: Option<u64>) -> Filter {
        Filter::Engaged(Engaged {
            link_contains: link.map(str::to_owned),
            within_seconds,
            ..engaged(Action::Clicked, source)
        })
    }

    fn workflow(workflow: &str, step: Option<&str>) -> Source {
        Source::Workflow { workflow: workflow.to_owned(), step: step.map(str::to_owned) }
    }

    #[test]
    fn given_engagement_phrases_when_parsed_then_each_gives_its_action_source_link_and_window() {
        let not = |filter| Filter::Not(Box::new(filter));
        for (text, expected) in [
            ("opened", opened(Source::Any)),
            ("has opened an email", opened(Source::Any)),
            ("opened any email from broadcast spring-sale", opened(Source::Broadcast("spring-sale".into()))),
            ("opened from template welcome", opened(Source::Template("welcome".into()))),
            ("opened an email from workflow onboarding", opened(workflow("onboarding", None))),
            (
                "opened an email from step send_welcome of workflow onboarding",
                opened(workflow("onboarding", Some("send_welcome"))),
            ),
            (
                "opened an email from workflow onboarding step send_welcome",
                opened(workflow("onboarding", Some("send_welcome"))),
            ),
            ("clicked", clicked(None, Source::Any, None)),
            ("has clicked a link containing pricing", clicked(Some("pricing"), Source::Any, None)),
            (
                "clicked a link containing \"/pricing page\" in an email from broadcast b1 in the last 2 days",
                clicked(Some("/pricing page"), Source::Broadcast("b1".into()), Some(172_800)),
            ),
            ("clicked link within 3 hours", clicked(None, Source::Any, Some(10_800))),
            (
                "has not opened in the last 90 days",
                not(Filter::Engaged(Engaged {
                    within_seconds: Some(90 * 86_400),
                    ..engaged(Action::Opened, Source::Any)
                })),
            ),
            ("did not open an email from template welcome", not(opened(Source::Template("welcome".into())))),
            ("did not click", not(clicked(None, Source::Any, None))),
            ("has not clicked a link", not(clicked(None, Source::Any, None))),
            (
                "opened including machines",
                Filter::Engaged(Engaged { machines: true, ..engaged(Action::Opened, Source::Any) }),
            ),
        ] {
            assert_eq!(parsed(text), expected, "{text}");
        }
        assert!(matches!(parsed("opened is true"), Filter::Condition(_)), "a field followed by a comparison");
        assert!(matches!(parsed("opened and plan is pro"), Filter::All(_)));
    }

    #[test]
    fn given_broken_engagement_phrases_when_parsed_then_the_error_says_what_was_expected() {
        let error = |text: &str| parse_plain(text).expect_err(text).to_string();
        assert!(error("opened an email from").contains("`broadcast`, `template`, `workflow` or `step`"));
        assert!(error("opened from step s1 of broadcast b").contains("`workflow`"));
        assert!(error("clicked a link containing").contains("the text of a link"));
        assert!(error("clicked in plan").contains("`an email` after `in`"));
        assert!(error("opened in the last 3 fortnights").contains("a unit"));
    }

    #[test]
    fn given_engagement_filters_when_described_then_the_words_read_back_to_the_same_filter() {
        for text in [
            "opened an email",
            "opened an email from broadcast \"in\" in the last 7 days including machines",
            "clicked a link containing \"pricing page\" in an email from step s1 of workflow w1",
            "clicked a link in an email from template welcome and has not opened an email in the last 90 days",
            "has not clicked a link containing pricing in the last 2 weeks",
            "opened an email from workflow w1 or plan is pro",
        ] {
            let filter = parsed(text);
            assert_eq!(describe(&filter), text, "canonical words");
            assert_eq!(parsed(&describe(&filter)), filter);
            assert_eq!(from_json(&filter.to_json()).expect("its JSON reads back"), filter);
        }
    }

    #[test]
    fn given_the_json_form_when_read_then_keys_are_checked_with_their_path() {
        let error = |value: Value| from_json(&value).expect_err("refused").to_string();
        assert_eq!(from_json(&json!({"opened": {}})).expect("every key is optional"), opened(Source::Any));
        assert_eq!(
            from_json(&json!({"clicked": {"from": {"workflow": "w", "step": "s"}, "linkContains": "x"}}))
                .expect("valid"),
            clicked(Some("x"), workflow("w", Some("s")), None)
        );
        assert!(error(json!({"opened": {"linkContains": "x"}})).contains("unknown key `linkContains`"));
        assert!(error(json!({"opened": {"from": {"broadcast": "b", "template": "t"}}})).contains("filter.opened.from"));
        assert!(error(json!({"opened": {"from": {"step": "s"}}})).contains("expected one of"));
        assert!(error(json!({"clicked": {"linkContains": ""}})).contains("from 1 to"));
        assert!(error(json!({"clicked": {"withinSeconds": 0}})).contains("a window"));
        assert!(error(json!({"opened": {"includeMachines": "yes"}})).contains("true or false"));
        assert!(error(json!({"opened": {"from": {"broadcast": " "}}})).contains("needs a name"));
    }

    fn open(at_ms: i64, machine: bool, broadcast_id: &str) -> Engagement {
        Engagement { opened: true, at_ms, machine, broadcast_id: broadcast_id.into(), ..Engagement::default() }
    }

    fn click(at_ms: i64, url: &str, workflow_id: &str, step_id: &str) -> Engagement {
        Engagement {
            at_ms,
            url: url.into(),
            workflow_id: workflow_id.into(),
            step_id: step_id.into(),
            template_id: "tpl_1".into(),
            ..Engagement::default()
        }
    }

    #[test]
    fn given_opens_when_evaluated_then_machines_are_left_out_and_the_window_ends_now() {
        let engagement = [open(1_000, false, "b1"), open(500, true, "b2")];
        let document = json!({});
        let events = std::collections::HashMap::new();
        let at = |now_ms| Facts { document: &document, events: &events, engagement: &engagement, now_ms };
        let recent = parsed("opened in the last 10 seconds");
        assert!(!matches_facts(&recent, &at(900)), "the person's open comes at 1 s");
        assert_eq!(next_change_ms(&recent, &at(900)), Some(1_000));
        assert!(matches_facts(&recent, &at(1_000)));
        assert_eq!(next_change_ms(&recent, &at(1_000)), Some(11_000), "it leaves the window at 11 s");
        assert!(!matches_facts(&recent, &at(11_000)));
        assert_eq!(next_change_ms(&recent, &at(11_000)), None);
        assert!(!matches_facts(&parsed("opened from broadcast b2"), &at(5_000)), "a machine's open");
        assert!(matches_facts(&parsed("opened from broadcast b2 including machines"), &at(5_000)));
        assert!(matches_facts(&parsed("opened from broadcast b1"), &at(5_000)));
        assert!(!matches_facts(&parsed("clicked"), &at(5_000)), "an open is not a click");
        assert!(matches_facts(&parsed("has not opened in the last 2 seconds"), &at(4_000)));
        assert!(!matches(&parsed("opened"), &document), "a document alone has no engagement");
    }

    #[test]
    fn given_clicks_when_evaluated_then_the_link_text_and_the_source_narrow_them() {
        let engagement = [click(1_000, "https://example.com/Pricing?plan=pro", "w1", "s2")];
        let document = json!({});
        let events = std::collections::HashMap::new();
        let facts = Facts { document: &document, events: &events, engagement: &engagement, now_ms: 2_000 };
        for (text, holds) in [
            ("clicked", true),
            ("clicked a link containing pricing", true),
            ("clicked a link containing /blog", false),
            ("clicked in an email from step s2 of workflow w1", true),
            ("clicked in an email from step s1 of workflow w1", false),
            ("clicked in an email from workflow w1", true),
            ("clicked in an email from template tpl_1", true),
            ("clicked in an email from broadcast w1", false),
            ("opened", false),
        ] {
            assert_eq!(matches_facts(&parsed(text), &facts), holds, "{text}");
        }
        assert_eq!(engaged_parts(&parsed("clicked and (opened or plan is x)")).len(), 2);
    }
}
