//! Suppression decisions: validating input, adding, and whether one may be removed.

use domain::suppressions::{API_REASONS, removable};
use platform::error::Code;
use platform::error::Issue;
use platform::events::seal;
use platform::proto;
use serde_json::Value;

use domain::attributes::normalize_email;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewSuppression {
    pub identifier: String,
    pub reason: String,
}

/// Why a suppression write is refused. The HTTP edge maps each to the contract's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The input is not a suppression; `issues` names every problem (400).
    #[error("{message}")]
    Invalid { code: Code, message: String, issues: Vec<Issue> },
    /// No such suppression in the caller's space, or already removed (404).
    #[error("no suppression {0:?} in this space")]
    NotFound(String),
    /// A global or provider (bounce, complaint) suppression (409).
    #[error(
        "only manual and legal suppressions of your space can be removed; global and provider (bounce, complaint) \
         suppressions cannot"
    )]
    NotRemovable,
}

impl Refusal {
    pub fn code(&self) -> Code {
        match self {
            Self::Invalid { code, .. } => *code,
            Self::NotFound(_) => Code::SuppressionNotFound,
            Self::NotRemovable => Code::SuppressionNotRemovable,
        }
    }
}

/// Parses `{identifier, reason}`: an email address and `manual` or `legal`.
pub(crate) fn parse_new(value: &Value) -> Result<NewSuppression, Refusal> {
    let Some(object) = value.as_object() else {
        let message = "a suppression is a JSON object {identifier, reason}".to_owned();
        return Err(Refusal::Invalid { code: Code::InvalidBody, message, issues: Vec::new() });
    };
    let mut issues = Vec::new();
    for key in object.keys().filter(|key| !matches!(key.as_str(), "identifier" | "reason")) {
        issues.push(Issue::coded(key, Code::UnknownField, format!("{key} is not a suppression field")));
    }
    let identifier = match object.get("identifier").and_then(Value::as_str) {
        Some(text) => match normalize_email(text) {
            Ok(email) => Some(email),
            Err(message) => {
                issues.push(Issue::coded("identifier", Code::InvalidIdentifier, message));
                None
            }
        },
        None => {
            issues.push(Issue::coded(
                "identifier",
                Code::InvalidIdentifier,
                "identifier (an email address) is required",
            ));
            None
        }
    };
    let reason = match object.get("reason").and_then(Value::as_str) {
        Some(reason) if API_REASONS.contains(&reason) => Some(reason.to_owned()),
        _ => {
            issues.push(Issue::coded("reason", Code::InvalidReason, "reason must be manual or legal"));
            None
        }
    };
    match (identifier, reason, issues.first()) {
        (Some(identifier), Some(reason), None) => Ok(NewSuppression { identifier, reason }),
        (_, _, first) => {
            let (code, message) = first.map_or((Code::InvalidBody, String::new()), |i| {
                (i.code.unwrap_or(Code::InvalidBody), i.message.clone())
            });
            Err(Refusal::Invalid { code, message, issues })
        }
    }
}

pub(crate) fn decide_add(
    space_id: &str,
    new: &NewSuppression,
    suppression_id: &str,
    now_ms: i64,
    source: &str,
) -> proto::SuppressionAdded {
    proto::SuppressionAdded {
        suppression_id: suppression_id.to_owned(),
        space_id: space_id.to_owned(),
        reason: new.reason.clone(),
        created_at_ms: now_ms,
        personal: Some(seal(suppression_id, &proto::SuppressionPersonal { identifier: new.identifier.clone() })),
        source: source.to_owned(),
    }
}

/// Decides removing `added` (`None` when it does not exist or was removed) for a caller in
/// `space_id`. Global suppressions are visible to every space but removable by none.
pub(crate) fn decide_remove(
    space_id: &str,
    suppression_id: &str,
    added: Option<&proto::SuppressionAdded>,
    now_ms: i64,
) -> Result<proto::SuppressionRemoved, Refusal> {
    let not_found = || Refusal::NotFound(suppression_id.to_owned());
    let added = added.ok_or_else(not_found)?;
    if !added.space_id.is_empty() && added.space_id != space_id {
        return Err(not_found());
    }
    if !removable(added) {
        return Err(Refusal::NotRemovable);
    }
    Ok(proto::SuppressionRemoved {
        suppression_id: added.suppression_id.clone(),
        space_id: added.space_id.clone(),
        removed_at_ms: now_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn input_needs_an_email_and_an_api_reason() {
        let parsed = parse_new(&json!({"identifier": " A@B.io ", "reason": "legal"})).expect("valid");
        assert_eq!(parsed, NewSuppression { identifier: "a@b.io".into(), reason: "legal".into() });
        for bad in [
            json!({"identifier": "nope", "reason": "manual"}),
            json!({"identifier": "a@b.io", "reason": "bounce"}),
            json!({"identifier": "a@b.io"}),
            json!({"identifier": "a@b.io", "reason": "manual", "extra": 1}),
            json!([1]),
        ] {
            assert!(matches!(parse_new(&bad), Err(Refusal::Invalid { .. })), "{bad}");
        }
    }

    #[test]
    fn only_manual_and_legal_of_the_callers_space_can_be_removed() {
        let new = |reason: &str| NewSuppression { identifier: "a@b.io".into(), reason: reason.into() };
        let manual = decide_add("spc_1", &new("manual"), "sup_1", 0, "api");
        assert!(decide_remove("spc_1", "sup_1", Some(&manual), 1).is_ok());
        let not_found = Err(Refusal::NotFound("sup_1".into()));
        assert_eq!(decide_remove("spc_2", "sup_1", Some(&manual), 1), not_found);
        assert_eq!(decide_remove("spc_1", "sup_1", None, 1), not_found);
        let bounce = decide_add("spc_1", &new("bounce"), "sup_2", 0, "provider");
        assert_eq!(decide_remove("spc_1", "sup_2", Some(&bounce), 1), Err(Refusal::NotRemovable));
        let global = decide_add("", &new("manual"), "sup_3", 0, "authoring");
        assert_eq!(decide_remove("spc_1", "sup_3", Some(&global), 1), Err(Refusal::NotRemovable));
    }
}
