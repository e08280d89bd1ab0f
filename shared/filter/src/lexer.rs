//! Plain words: the tokens (words, quoted texts, symbols, parentheses and commas), each with
//! its character position.

use std::fmt;

use serde_json::Value;

use crate::FilterError;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub(crate) kind: TokenKind,
    /// The 1-based character position of its first character.
    pub(crate) position: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TokenKind {
    Word(String),
    Quoted(String),
    Symbol(Symbol),
    Open,
    Close,
    Comma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Symbol {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
}

impl fmt::Display for TokenKind {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenKind::Word(word) => write!(formatter, "`{word}`"),
            TokenKind::Quoted(text) => write!(formatter, "{}", Value::String(text.clone())),
            TokenKind::Symbol(symbol) => write!(formatter, "`{symbol}`"),
            TokenKind::Open => formatter.write_str("`(`"),
            TokenKind::Close => formatter.write_str("`)`"),
            TokenKind::Comma => formatter.write_str("`,`"),
        }
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Symbol::Eq => "=",
            Symbol::Ne => "!=",
            Symbol::Gt => ">",
            Symbol::Gte => ">=",
            Symbol::Lt => "<",
            Symbol::Lte => "<=",
        })
    }
}

pub(crate) fn is_word_char(character: char) -> bool {
    !character.is_whitespace() && !matches!(character, '(' | ')' | ',' | '=' | '!' | '<' | '>')
}

pub(crate) fn tokenize(text: &str) -> Result<Vec<Token>, FilterError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut index = 0;
    while let Some(&character) = chars.get(index) {
        let position = index + 1;
        let next_is_equals = chars.get(index + 1) == Some(&'=');
        let kind = match character {
            _ if character.is_whitespace() => {
                index += 1;
                continue;
            }
            '(' | ')' | ',' => {
                index += 1;
                match character {
                    '(' => TokenKind::Open,
                    ')' => TokenKind::Close,
                    _ => TokenKind::Comma,
                }
            }
            '"' | '\'' => {
                let (content, after) = read_quoted(&chars, index)?;
                index = after;
                TokenKind::Quoted(content)
            }
            '=' => {
                index += if next_is_equals { 2 } else { 1 };
                TokenKind::Symbol(Symbol::Eq)
            }
            '!' if next_is_equals => {
                index += 2;
                TokenKind::Symbol(Symbol::Ne)
            }
            '!' => {
                return Err(FilterError::new(format!(
                    "expected `!=` at character {position}, found a lone `!`; quote a value that contains it"
                )));
            }
            '>' | '<' => {
                index += if next_is_equals { 2 } else { 1 };
                TokenKind::Symbol(match (character, next_is_equals) {
                    ('>', false) => Symbol::Gt,
                    ('>', true) => Symbol::Gte,
                    (_, false) => Symbol::Lt,
                    (_, true) => Symbol::Lte,
                })
            }
            _ => {
                let start = index;
                while chars.get(index).is_some_and(|&character| is_word_char(character)) {
                    index += 1;
                }
                TokenKind::Word(chars[start..index].iter().collect())
            }
        };
        tokens.push(Token { kind, position });
    }
    Ok(tokens)
}

/// The content of the quoted string opening at `open` and the index just past it.
fn read_quoted(chars: &[char], open: usize) -> Result<(String, usize), FilterError> {
    let quote = chars.get(open).copied();
    let unclosed = || FilterError::new(format!("the quote opened at character {} is never closed", open + 1));
    let mut content = String::new();
    let mut index = open + 1;
    loop {
        match chars.get(index).copied() {
            None => return Err(unclosed()),
            Some('\\') => {
                content.push(*chars.get(index + 1).ok_or_else(unclosed)?);
                index += 2;
            }
            Some(character) if Some(character) == quote => return Ok((content, index + 1)),
            Some(character) => {
                content.push(character);
                index += 1;
            }
        }
    }
}
