//! Plain words: the engagement phrases (`opened ...`, `clicked ...` and their negations).

use crate::engaged::checked;
use crate::lexer::{Token, TokenKind};
use crate::parser::{Parser, is_comparison_word, is_connective};
use crate::{Action, Engaged, Filter, FilterError, Source};

impl Parser {
    /// The phrases `opened`, `has opened`, `clicked`, `has clicked` and their negations `did
    /// not open`, `has not opened`, `did not click`, `has not clicked`, when they begin here.
    /// A field of one of those names followed by a comparison is still a condition (`opened
    /// is true`).
    pub(super) fn engaged_fact(&mut self) -> Result<Option<Filter>, FilterError> {
        let action_at = |parser: &Self, offset: usize| {
            if parser.keyword_at(offset, "opened") {
                Some(Action::Opened)
            } else if parser.keyword_at(offset, "clicked") {
                Some(Action::Clicked)
            } else {
                None
            }
        };
        let comparison_follows = |parser: &Self, offset: usize| {
            matches!(parser.tokens.get(parser.next + offset),
                Some(Token { kind: TokenKind::Word(word), .. }) if is_comparison_word(word))
        };
        let (action, skip, negated) = if let Some(action) = action_at(self, 0) {
            if comparison_follows(self, 1) {
                return Ok(None);
            }
            (action, 1, false)
        } else if self.keyword_at(0, "has") && action_at(self, 1).is_some() {
            (action_at(self, 1).unwrap_or(Action::Opened), 2, false)
        } else if self.keyword_at(0, "has") && self.keyword_at(1, "not") && action_at(self, 2).is_some() {
            (action_at(self, 2).unwrap_or(Action::Opened), 3, true)
        } else if self.keyword_at(0, "did") && self.keyword_at(1, "not") && self.keyword_at(2, "open") {
            (Action::Opened, 3, true)
        } else if self.keyword_at(0, "did") && self.keyword_at(1, "not") && self.keyword_at(2, "click") {
            (Action::Clicked, 3, true)
        } else {
            return Ok(None);
        };
        let position = self.peek().map_or(self.end_position, |token| token.position);
        self.next += skip;
        let engaged = self.engaged(action)?;
        let engaged = checked(engaged).map_err(|message| {
            FilterError::new(format!("{message} (in `{}` at character {position})", action.word()))
        })?;
        let fact = Filter::Engaged(engaged);
        Ok(Some(if negated { Filter::Not(Box::new(fact)) } else { fact }))
    }

    /// After the verb: for clicks `[a link | any link | link] [containing <text>] [in]`, then
    /// `[an email | any email | email] [from <source>] [<window>] [including machines]`.
    fn engaged(&mut self, action: Action) -> Result<Engaged, FilterError> {
        let mut link_contains = None;
        if action == Action::Clicked {
            if (self.keyword_at(0, "a") || self.keyword_at(0, "any")) && self.keyword_at(1, "link") {
                self.next += 2;
            } else {
                self.eat_keyword("link");
            }
            if self.eat_keyword("containing") {
                link_contains = Some(self.name("the text of a link after `containing`")?);
            }
            if self.keyword_at(0, "in") && !self.keyword_at(1, "the") {
                self.next += 1;
                if !self.email_words() {
                    return Err(self.expected("`an email` after `in`"));
                }
            }
        }
        self.email_words();
        let source = if self.eat_keyword("from") { self.source()? } else { Source::Any };
        let within_seconds = self.window()?;
        let machines = self.keyword_at(0, "including") && self.keyword_at(1, "machines");
        if machines {
            self.next += 2;
        }
        Ok(Engaged { action, source, link_contains, within_seconds, machines })
    }

    /// `an email`, `any email` or `email`, when they come next.
    fn email_words(&mut self) -> bool {
        if (self.keyword_at(0, "an") || self.keyword_at(0, "any")) && self.keyword_at(1, "email") {
            self.next += 2;
            true
        } else {
            self.eat_keyword("email")
        }
    }

    /// After `from`: `broadcast <id>`, `template <id>`, `workflow <id> [step <id>]` or
    /// `step <id> of workflow <id>`.
    fn source(&mut self) -> Result<Source, FilterError> {
        if self.eat_keyword("broadcast") {
            return Ok(Source::Broadcast(self.name("a broadcast after `from broadcast`")?));
        }
        if self.eat_keyword("template") {
            return Ok(Source::Template(self.name("a template after `from template`")?));
        }
        if self.eat_keyword("workflow") {
            let workflow = self.name("a workflow after `from workflow`")?;
            let step = if self.eat_keyword("step") { Some(self.name("a step after `step`")?) } else { None };
            return Ok(Source::Workflow { workflow, step });
        }
        if self.eat_keyword("step") {
            let step = self.name("a step after `from step`")?;
            self.expect_keyword("of", "the step")?;
            self.expect_keyword("workflow", "of")?;
            let workflow = self.name("a workflow after `of workflow`")?;
            return Ok(Source::Workflow { workflow, step: Some(step) });
        }
        Err(self.expected("`broadcast`, `template`, `workflow` or `step` after `from`"))
    }

    /// A name or a text: a bare word (not `and` or `or`) or a quoted text.
    fn name(&mut self, what: &str) -> Result<String, FilterError> {
        let name = match self.peek() {
            Some(Token { kind: TokenKind::Word(word), .. }) if !is_connective(word) => word.clone(),
            Some(Token { kind: TokenKind::Quoted(text), .. }) => text.clone(),
            _ => return Err(self.expected(what)),
        };
        self.next += 1;
        Ok(name)
    }
}
