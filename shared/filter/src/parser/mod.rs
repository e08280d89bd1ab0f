//! Plain words: the grammar, from tokens to a [`Filter`], with the refusals that say what to
//! write instead.

mod engaged;

use crate::ast::bare_scalar;
use crate::checks::{checked_op, checked_performed};
use crate::describe::{comparison_words, describe_condition, describe_scalar, plain_text, value_words};
use crate::lexer::{Symbol, Token, TokenKind};
use crate::{
    CONSENT_EMAIL, Condition, FieldPath, Filter, FilterError, MAX_DEPTH, Op, Performed, SUBSCRIBED, SUBSCRIPTIONS,
    Scalar, all_of, any_of,
};

// Plain words: grammar.
//
//     expression     := or_expression ("," ["and"] or_expression)*
//     or_expression  := and_expression ("or" and_expression)*
//     and_expression := unary ("and" unary)*
//     unary          := "not" unary | "(" expression ")" | contact_fact | condition
//     condition      := field comparison ("or" lone_value)*
//
// The comma is an `and` of the lowest precedence, as people write a list of requirements
// (`plan is pro or plan is team, subscribed to news`). A comma inside `is one of` separates
// values unless a condition starts after it, and a lone value (a value followed by the end,
// `,`, `)`, `and` or `or`) after `or` repeats the condition's field and comparison unless it
// starts a contact fact (`opened`): what parsed before these forms existed parses the same.

pub(crate) struct Parser {
    pub(crate) tokens: Vec<Token>,
    pub(crate) next: usize,
    /// How many `(` and `not` enclose the current position, bounded so that recursion is.
    pub(crate) nesting: usize,
    pub(crate) end_position: usize,
}

/// A value standing alone where a condition could start (`enterprise` in `plan is pro or
/// enterprise`).
struct LoneValue {
    text: String,
    quoted: bool,
    /// The 1-based character position of the value.
    position: usize,
    /// The value as an error message shows it.
    shown: String,
}

impl Parser {
    /// Requirements separated by commas, all of which hold: `a or b, c` is `(a or b) and c`.
    /// `, and` reads as `,`; `, or` is refused, since the comma already means `and`.
    pub(crate) fn expression(&mut self) -> Result<Filter, FilterError> {
        let mut parts = vec![self.or_expression()?];
        while let Some(Token { kind: TokenKind::Comma, position }) = self.peek().cloned() {
            self.next += 1;
            let and = self.eat_keyword("and");
            let after_comma = format!("a condition such as `plan is pro` after the `,` at character {position}");
            if !and && self.keyword_at(0, "or") {
                return Err(FilterError::new(format!(
                    "{}; a comma means `and`, so `, or` is ambiguous: write `or` without the comma and group \
                     with parentheses, as in `(plan is pro or plan is team), subscribed to news`",
                    self.expected(&after_comma)
                )));
            }
            if self.peek().is_none_or(|token| token.kind == TokenKind::Close) {
                return Err(self.expected(&after_comma));
            }
            parts.push(self.or_expression()?);
        }
        Ok(all_of(parts))
    }

    fn or_expression(&mut self) -> Result<Filter, FilterError> {
        let mut parts = vec![self.and_expression()?];
        while self.eat_keyword("or") {
            parts.push(self.and_expression()?);
        }
        Ok(any_of(parts))
    }

    fn and_expression(&mut self) -> Result<Filter, FilterError> {
        let mut parts = vec![self.unary()?];
        while self.eat_keyword("and") {
            parts.push(self.unary()?);
        }
        Ok(all_of(parts))
    }

    fn unary(&mut self) -> Result<Filter, FilterError> {
        if self.eat_keyword("not") {
            self.enter()?;
            let inner = self.unary()?;
            self.nesting -= 1;
            return Ok(Filter::Not(Box::new(inner)));
        }
        if let Some(Token { kind: TokenKind::Open, position }) = self.peek().cloned() {
            self.next += 1;
            self.enter()?;
            let inner = self.expression()?;
            if self.peek().is_some_and(|token| token.kind == TokenKind::Close) {
                self.next += 1;
            } else {
                return Err(self.expected(&format!("`)` to close the `(` at character {position}")));
            }
            self.nesting -= 1;
            return Ok(inner);
        }
        if let Some(filter) = self.contact_fact()? {
            return Ok(filter);
        }
        self.condition()
    }

    /// The phrases about a contact beside its fields: `performed <event> ...`, `has performed`,
    /// `has not performed`, `did not perform`, `subscribed to <topic>` and `has email consent`
    /// (`has no email consent`). A field of one of those names followed by a comparison is
    /// still a condition (`performed is true`).
    fn contact_fact(&mut self) -> Result<Option<Filter>, FilterError> {
        if let Some(fact) = self.engaged_fact()? {
            return Ok(Some(fact));
        }
        let value_follows = |parser: &Self, offset: usize| {
            matches!(parser.tokens.get(parser.next + offset), Some(Token { kind: TokenKind::Quoted(_), .. }))
                || matches!(parser.tokens.get(parser.next + offset),
                    Some(Token { kind: TokenKind::Word(word), .. }) if !is_comparison_word(word))
        };
        if self.keyword_at(0, "performed") && value_follows(self, 1) {
            self.next += 1;
            return self.performed().map(Some);
        }
        if self.keyword_at(0, "has") && self.keyword_at(1, "performed") {
            self.next += 2;
            return self.performed().map(Some);
        }
        let negated_performed =
            (self.keyword_at(0, "has") && self.keyword_at(1, "not") && self.keyword_at(2, "performed"))
                || (self.keyword_at(0, "did") && self.keyword_at(1, "not") && self.keyword_at(2, "perform"));
        if negated_performed {
            self.next += 3;
            return Ok(Some(Filter::Not(Box::new(self.performed()?))));
        }
        if self.keyword_at(0, "subscribed") && self.keyword_at(1, "to") {
            self.next += 2;
            let (topic, position) = match self.peek() {
                Some(Token { kind: TokenKind::Word(word) | TokenKind::Quoted(word), position }) => {
                    (word.clone(), *position)
                }
                None | Some(_) => return Err(self.expected("a topic after `subscribed to`")),
            };
            self.next += 1;
            let field = FieldPath::parse(&format!("{SUBSCRIPTIONS}.{topic}"))
                .map_err(|error| FilterError::new(format!("{error} (the topic at character {position})")))?;
            return Ok(Some(Filter::Condition(Condition { field, op: Op::Eq(Scalar::String(SUBSCRIBED.to_owned())) })));
        }
        let consent = |negated: bool| {
            let condition = Filter::Condition(Condition {
                field: FieldPath(CONSENT_EMAIL.to_owned()),
                op: Op::Eq(Scalar::Bool(true)),
            });
            if negated { Filter::Not(Box::new(condition)) } else { condition }
        };
        if self.keyword_at(0, "has") && self.keyword_at(1, "email") && self.keyword_at(2, "consent") {
            self.next += 3;
            return Ok(Some(consent(false)));
        }
        if self.keyword_at(0, "has")
            && self.keyword_at(1, "no")
            && self.keyword_at(2, "email")
            && self.keyword_at(3, "consent")
        {
            self.next += 4;
            return Ok(Some(consent(true)));
        }
        Ok(None)
    }

    /// After `performed`: `<event> [at least N time(s)] [in the last | within [the last] N <unit>]`.
    fn performed(&mut self) -> Result<Filter, FilterError> {
        let (event, position) = match self.peek() {
            Some(Token { kind: TokenKind::Word(word), position }) if !is_connective(word) => (word.clone(), *position),
            Some(Token { kind: TokenKind::Quoted(text), position }) => (text.clone(), *position),
            _ => return Err(self.expected("the name of an event after `performed`")),
        };
        self.next += 1;
        let mut at_least = 1;
        if self.keyword_at(0, "at") && self.keyword_at(1, "least") {
            self.next += 2;
            at_least = self.whole_number("`at least`")?;
            if !(self.eat_keyword("times") || self.eat_keyword("time")) {
                return Err(self.expected("`times` after the count"));
            }
        }
        let within_seconds = self.window()?;
        let performed = checked_performed(Performed { event, at_least, within_seconds })
            .map_err(|message| FilterError::new(format!("{message} (in `performed` at character {position})")))?;
        Ok(Filter::Performed(performed))
    }

    /// `in the last N <unit>` or `within [the last] N <unit>`, when it comes next: its seconds.
    fn window(&mut self) -> Result<Option<u64>, FilterError> {
        let window_opens = if self.keyword_at(0, "in") && self.keyword_at(1, "the") && self.keyword_at(2, "last") {
            self.next += 3;
            true
        } else if self.eat_keyword("within") {
            if self.keyword_at(0, "the") && self.keyword_at(1, "last") {
                self.next += 2;
            }
            true
        } else {
            false
        };
        if window_opens {
            let count = u64::from(self.whole_number("`in the last`")?);
            let unit = match self.peek() {
                Some(Token { kind: TokenKind::Word(word), .. }) => unit_seconds(word),
                _ => None,
            };
            let Some(unit) = unit else {
                return Err(self.expected("a unit: seconds, minutes, hours, days or weeks"));
            };
            self.next += 1;
            return Ok(Some(count.saturating_mul(unit)));
        }
        Ok(None)
    }

    /// A whole number from 1 up.
    fn whole_number(&mut self, after: &str) -> Result<u32, FilterError> {
        let number = match self.peek() {
            Some(Token { kind: TokenKind::Word(word), .. }) => word.parse::<u32>().ok().filter(|&number| number > 0),
            _ => None,
        };
        let Some(number) = number else {
            return Err(self.expected(&format!("a whole number from 1 after {after}")));
        };
        self.next += 1;
        Ok(number)
    }

    fn enter(&mut self) -> Result<(), FilterError> {
        self.nesting += 1;
        if self.nesting > MAX_DEPTH {
            let position = self.peek().map_or(self.end_position, |token| token.position);
            return Err(FilterError::new(format!(
                "the filter nests deeper than {MAX_DEPTH} levels at character {position}"
            )));
        }
        Ok(())
    }

    fn condition(&mut self) -> Result<Filter, FilterError> {
        let field_token = match self.peek() {
            Some(Token { kind: TokenKind::Word(word), position }) if !is_connective(word) => (word.clone(), *position),
            Some(Token { kind: TokenKind::Quoted(text), position }) => (text.clone(), *position),
            _ => return Err(self.expected("a condition such as `plan is pro`")),
        };
        let (name, position) = field_token;
        self.next += 1;
        let field =
            FieldPath::parse(&name).map_err(|error| FilterError::new(format!("{error} (at character {position})")))?;
        let (op, negated) = self.comparison(&name)?;
        let in_condition = |message: String| {
            FilterError::new(format!("{message} (in the condition on `{name}` at character {position})"))
        };
        let first = Condition { field, op: checked_op(op).map_err(in_condition)? };
        let takes_value = !matches!(first.op, Op::Exists | Op::NotExists);
        // `plan is pro or enterprise`: each lone value after `or` repeats the field and comparison.
        let mut values_written: Vec<String> = value_words(&first.op).into_iter().collect();
        let mut alternatives = Vec::new();
        while takes_value
            && self.keyword_at(0, "or")
            && let Some(value) = self.lone_value(1)
        {
            if negated || !matches!(first.op, Op::Eq(_) | Op::Contains(_) | Op::StartsWith(_) | Op::EndsWith(_)) {
                return Err(or_list_refusal(&first, negated, &value));
            }
            self.next += 1;
            let (text, quoted) = self.value_token("`or`")?;
            let op = checked_op(first.op.with_value(&text, quoted)).map_err(in_condition)?;
            values_written.push(value.written());
            alternatives.push(Filter::Condition(Condition { field: first.field.clone(), op }));
        }
        // `plan is pro and enterprise`: a lone value where a condition must come.
        let joiner = match self.peek() {
            Some(Token { kind: TokenKind::Comma, .. }) if self.keyword_at(1, "and") => Some(("`, and`", 2)),
            Some(Token { kind: TokenKind::Comma, .. }) => Some(("`,`", 1)),
            _ if self.keyword_at(0, "and") => Some(("`and`", 1)),
            _ => None,
        };
        if takes_value
            && let Some((joiner, skip)) = joiner
            && let Some(value) = self.lone_value(skip)
        {
            return Err(lone_value_refusal(joiner, &first, negated, &values_written, &value));
        }
        let condition = Filter::Condition(first);
        let condition = if negated { Filter::Not(Box::new(condition)) } else { condition };
        Ok(if alternatives.is_empty() {
            condition
        } else {
            any_of(std::iter::once(condition).chain(alternatives).collect())
        })
    }

    /// The comparison after a field, and whether the condition is negated (`does not
    /// contain`, `is not one of`, `is not greater than`).
    fn comparison(&mut self, field: &str) -> Result<(Op, bool), FilterError> {
        if let Some(Token { kind: TokenKind::Symbol(symbol), .. }) = self.peek().cloned() {
            self.next += 1;
            let value = self.scalar(&format!("`{symbol}`"))?;
            let op = match symbol {
                Symbol::Eq => Op::Eq(value),
                Symbol::Ne => Op::Ne(value),
                Symbol::Gt => Op::Gt(value),
                Symbol::Gte => Op::Gte(value),
                Symbol::Lt => Op::Lt(value),
                Symbol::Lte => Op::Lte(value),
            };
            return Ok((op, false));
        }
        if self.eat_keyword("is") {
            if self.eat_keyword("not") {
                if self.eat_keyword("set") {
                    return Ok((Op::NotExists, false));
                }
                if self.eat_keyword("missing") {
                    return Ok((Op::Exists, false));
                }
                if self.eat_keyword("one") {
                    self.expect_keyword("of", "one")?;
                    return Ok((Op::In(self.list()?), true));
                }
                return Ok(match self.ordering_or_equality()? {
                    Some(Op::Eq(value)) => (Op::Ne(value), false),
                    Some(op) => (op, true),
                    None => (Op::Ne(self.scalar("`is not`")?), false),
                });
            }
            if self.eat_keyword("set") {
                return Ok((Op::Exists, false));
            }
            if self.eat_keyword("missing") {
                return Ok((Op::NotExists, false));
            }
            if self.eat_keyword("one") {
                self.expect_keyword("of", "one")?;
                return Ok((Op::In(self.list()?), false));
            }
            return Ok(match self.ordering_or_equality()? {
                Some(op) => (op, false),
                None => (Op::Eq(self.scalar("`is`")?), false),
            });
        }
        if let Some(op) = self.ordering_or_equality()? {
            return Ok((op, false));
        }
        if self.eat_keyword("equals") {
            return Ok((Op::Eq(self.scalar("`equals`")?), false));
        }
        if self.eat_keyword("contains") {
            return Ok((Op::Contains(self.scalar("`contains`")?), false));
        }
        if self.eat_keyword("starts") {
            self.expect_keyword("with", "starts")?;
            return Ok((Op::StartsWith(self.text("`starts with`")?), false));
        }
        if self.eat_keyword("ends") {
            self.expect_keyword("with", "ends")?;
            return Ok((Op::EndsWith(self.text("`ends with`")?), false));
        }
        if self.eat_keyword("exists") {
            return Ok((Op::Exists, false));
        }
        if self.eat_keyword("does") {
            self.expect_keyword("not", "does")?;
            if self.eat_keyword("contain") {
                return Ok((Op::Contains(self.scalar("`does not contain`")?), true));
            }
            if self.eat_keyword("exist") {
                return Ok((Op::NotExists, false));
            }
            return Err(self.expected("`contain` or `exist` after `does not`"));
        }
        Err(self.expected(&format!(
            "`is`, `equals`, `contains`, `starts with`, `ends with`, `exists` or a comparison such as `>` \
             after the field `{field}`"
        )))
    }

    /// `greater than`, `more than`, `above`, `over`, `less than`, `below`, `under`, `at least`,
    /// `at most` and `equal to`, each with its value; `None` when none of them comes next.
    fn ordering_or_equality(&mut self) -> Result<Option<Op>, FilterError> {
        for word in ["greater", "more", "less"] {
            if self.eat_keyword(word) {
                self.expect_keyword("than", word)?;
                let or_equal = self.keyword_at(0, "or") && self.keyword_at(1, "equal");
                if or_equal {
                    self.next += 2;
                    self.expect_keyword("to", "or equal")?;
                }
                let value = self.scalar(&format!("`{word} than`"))?;
                return Ok(Some(match (word, or_equal) {
                    ("less", false) => Op::Lt(value),
                    ("less", true) => Op::Lte(value),
                    (_, false) => Op::Gt(value),
                    (_, true) => Op::Gte(value),
                }));
            }
        }
        for word in ["above", "over"] {
            if self.eat_keyword(word) {
                return Ok(Some(Op::Gt(self.scalar(&format!("`{word}`"))?)));
            }
        }
        for word in ["below", "under"] {
            if self.eat_keyword(word) {
                return Ok(Some(Op::Lt(self.scalar(&format!("`{word}`"))?)));
            }
        }
        if self.eat_keyword("at") {
            if self.eat_keyword("least") {
                return Ok(Some(Op::Gte(self.scalar("`at least`")?)));
            }
            if self.eat_keyword("most") {
                return Ok(Some(Op::Lte(self.scalar("`at most`")?)));
            }
            return Err(self.expected("`least` or `most` after `at`"));
        }
        if self.eat_keyword("equal") {
            self.expect_keyword("to", "equal")?;
            return Ok(Some(Op::Eq(self.scalar("`equal to`")?)));
        }
        Ok(None)
    }

    /// The values of `one of`: `a, b, c`, `a, b or c` or `a, b, or c`. A comma followed by a
    /// value standing alone separates values, as it always did (even `opened`); one followed
    /// by a condition, a contact fact or `and` ends the list and joins what follows. After the
    /// value of an `or`, a comma always ends the list.
    fn list(&mut self) -> Result<Vec<Scalar>, FilterError> {
        let mut values = vec![self.scalar("`one of`")?];
        let mut after_or = false;
        loop {
            let comma = self.peek().is_some_and(|token| token.kind == TokenKind::Comma);
            if comma && !after_or && self.value_alone_at(1) {
                self.next += 1;
                values.push(self.scalar("`,`")?);
            } else if comma && !after_or && self.keyword_at(1, "or") && self.lone_value(2).is_some() {
                self.next += 2;
                values.push(self.scalar("`or`")?);
                after_or = true;
            } else if comma
                && !after_or
                && !self.keyword_at(1, "and")
                && !self.keyword_at(1, "or")
                && !self.condition_at(1)
            {
                // Not a value alone either: read it as one, to say what is wrong with it.
                self.next += 1;
                values.push(self.scalar("`,`")?);
            } else if !comma && self.keyword_at(0, "or") && self.lone_value(1).is_some() {
                self.next += 1;
                values.push(self.scalar("`or`")?);
                after_or = true;
            } else {
                return Ok(values);
            }
        }
    }

    /// Whether the token at `offset` is a value standing alone: a quoted text or a bare word
    /// (not `and`, `or` or `not`) followed by the end, `,`, `)`, `and` or `or`.
    fn value_alone_at(&self, offset: usize) -> bool {
        let value = match self.tokens.get(self.next + offset).map(|token| &token.kind) {
            Some(TokenKind::Quoted(_)) => true,
            Some(TokenKind::Word(word)) => !is_connective(word) && !word.eq_ignore_ascii_case("not"),
            _ => false,
        };
        let alone = match self.tokens.get(self.next + offset + 1).map(|token| &token.kind) {
            None | Some(TokenKind::Comma | TokenKind::Close) => true,
            Some(TokenKind::Word(word)) => is_connective(word),
            Some(_) => false,
        };
        value && alone
    }

    /// The value standing alone at `offset` where no condition or contact fact starts: `opened`
    /// alone stays the contact fact it always was.
    fn lone_value(&mut self, offset: usize) -> Option<LoneValue> {
        if !self.value_alone_at(offset) || self.condition_at(offset) {
            return None;
        }
        let token = self.tokens.get(self.next + offset)?;
        let (text, quoted) = match &token.kind {
            TokenKind::Quoted(text) => (text.clone(), true),
            TokenKind::Word(word) => (word.clone(), false),
            _ => return None,
        };
        Some(LoneValue { text, quoted, position: token.position, shown: token.kind.to_string() })
    }

    /// Whether a condition starts at `offset`: `(`, `not`, a contact fact (a malformed one too,
    /// so that its own error is the one reported) or a field followed by a comparison. The
    /// contact facts are recognised by reading one and going back, so that this stays what
    /// [`Parser::unary`] accepts.
    fn condition_at(&mut self, offset: usize) -> bool {
        let start = self.next;
        self.next += offset;
        let starts = match self.peek().map(|token| &token.kind) {
            None => false,
            Some(TokenKind::Open) => true,
            Some(_) if self.keyword_at(0, "not") => true,
            Some(kind) => {
                let field = match kind {
                    TokenKind::Quoted(_) => true,
                    TokenKind::Word(word) => !is_connective(word),
                    _ => false,
                };
                let comparison = match self.tokens.get(self.next + 1).map(|token| &token.kind) {
                    Some(TokenKind::Symbol(_)) => true,
                    Some(TokenKind::Word(word)) => is_comparison_word(word),
                    _ => false,
                };
                (field && comparison) || !matches!(self.contact_fact(), Ok(None))
            }
        };
        self.next = start;
        starts
    }

    /// A value: quoted text is a string, a bare token a boolean, number or string.
    fn scalar(&mut self, after: &str) -> Result<Scalar, FilterError> {
        let (word, quoted) = self.value_token(after)?;
        Ok(if quoted { Scalar::String(word) } else { bare_scalar(&word) })
    }

    /// A value taken as text, however it reads.
    fn text(&mut self, after: &str) -> Result<String, FilterError> {
        self.value_token(after).map(|(text, _)| text)
    }

    /// The next value's text and whether it was quoted.
    fn value_token(&mut self, after: &str) -> Result<(String, bool), FilterError> {
        let value = match self.peek() {
            Some(Token { kind: TokenKind::Quoted(text), .. }) => (text.clone(), true),
            Some(Token { kind: TokenKind::Word(word), position }) if word.eq_ignore_ascii_case("null") => {
                return Err(FilterError::new(format!(
                    "`null` at character {position} is not a value; use `is set` or `is not set`, or quote it"
                )));
            }
            Some(Token { kind: TokenKind::Word(word), .. })
                if !is_connective(word) && !word.eq_ignore_ascii_case("not") =>
            {
                (word.clone(), false)
            }
            _ => return Err(self.expected(&format!("a value after {after}"))),
        };
        self.next += 1;
        Ok(value)
    }

    pub(crate) fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.next)
    }

    fn keyword_at(&self, offset: usize, keyword: &str) -> bool {
        matches!(
            self.tokens.get(self.next + offset),
            Some(Token { kind: TokenKind::Word(word), .. }) if word.eq_ignore_ascii_case(keyword)
        )
    }

    fn eat_keyword(&mut self, keyword: &str) -> bool {
        let found = self.keyword_at(0, keyword);
        if found {
            self.next += 1;
        }
        found
    }

    fn expect_keyword(&mut self, keyword: &str, after: &str) -> Result<(), FilterError> {
        if self.eat_keyword(keyword) { Ok(()) } else { Err(self.expected(&format!("`{keyword}` after `{after}`"))) }
    }

    pub(crate) fn expected(&self, what: &str) -> FilterError {
        match self.peek() {
            Some(token) => {
                FilterError::new(format!("expected {what}, found {} at character {}", token.kind, token.position))
            }
            None => FilterError::new(format!("expected {what}, found the end of the text")),
        }
    }
}

/// The words that begin a comparison after a field.
fn is_comparison_word(word: &str) -> bool {
    [
        "is", "equals", "contains", "starts", "ends", "exists", "does", "greater", "more", "less", "above", "over",
        "below", "under", "at", "equal",
    ]
    .iter()
    .any(|keyword| keyword.eq_ignore_ascii_case(word))
}

/// The refusal of `or <value>` after a comparison that takes no list of values (`plan is not
/// free or trial`, `age > 30 or 40`), with what to write instead.
fn or_list_refusal(first: &Condition, negated: bool, value: &LoneValue) -> FilterError {
    let field = plain_text(first.field.as_str());
    let written = value.written();
    let hint = match (&first.op, negated) {
        // People mean neither value, while two negative conditions joined by `or` hold for
        // almost everyone: refused rather than read one way or the other.
        (Op::Ne(excluded), false) => format!(
            "a negative comparison takes one value: to exclude both, write `{field} is not one of {}, {written}`",
            describe_scalar(excluded)
        ),
        (Op::Contains(_), true) => format!(
            "a negative comparison takes one value: to exclude both, write `not ({} or {written})`",
            describe_condition(first)
        ),
        _ => format!(
            "only `is`, `contains`, `starts with`, `ends with` and `is one of` take more values after `or`: \
             repeat the field and comparison, as in `{field} {} {written}`",
            comparison_words(&first.op, negated)
        ),
    };
    FilterError::new(format!(
        "expected a condition after `or`, found the lone value {} at character {}; {hint}",
        value.shown, value.position
    ))
}

/// The refusal of a lone value after `and` or a comma (`plan is pro and enterprise`), with what
/// to write instead; `values_written` are the condition's values so far, as written.
fn lone_value_refusal(
    joiner: &str,
    first: &Condition,
    negated: bool,
    values_written: &[String],
    value: &LoneValue,
) -> FilterError {
    let field = plain_text(first.field.as_str());
    let comparison = comparison_words(&first.op, negated);
    let written = value.written();
    let hint = match (&first.op, negated) {
        (Op::Eq(_), false) => format!(
            "a field cannot equal two values: to match either, write `{field} is {} or {written}`",
            values_written.join(" or ")
        ),
        (Op::Ne(_), false) => {
            format!("to exclude both values, write `{field} is not one of {}, {written}`", values_written.join(", "))
        }
        (Op::In(_), _) => {
            format!("to list another value, write `{field} {comparison} {}, {written}`", values_written.join(", "))
        }
        _ => format!(
            "{joiner} joins conditions: repeat the field and comparison, as in `{field} {comparison} {written}`"
        ),
    };
    FilterError::new(format!(
        "expected a condition after {joiner}, found the lone value {} at character {}; {hint}",
        value.shown, value.position
    ))
}

impl LoneValue {
    /// The value as plain words write it: as typed when bare, quoted when it needs quotes.
    fn written(&self) -> String {
        if self.quoted { plain_text(&self.text) } else { self.text.clone() }
    }
}

/// Seconds in one `unit` (singular or plural).
fn unit_seconds(unit: &str) -> Option<u64> {
    let unit = unit.to_ascii_lowercase();
    Some(match unit.strip_suffix('s').unwrap_or(&unit) {
        "second" => 1,
        "minute" => 60,
        "hour" => 3_600,
        "day" => 86_400,
        "week" => 604_800,
        _ => return None,
    })
}

fn is_connective(word: &str) -> bool {
    word.eq_ignore_ascii_case("and") || word.eq_ignore_ascii_case("or")
}

#[cfg(test)]
mod tests;
