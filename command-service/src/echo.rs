//! A `PATCH` body may be the resource as a `GET` returned it, whole or in part (decision
//! "PATCH accepts what GET returns" in `docs/decisions.md`). Two kinds of returned field are
//! not inputs of an update:
//! - **fixed** fields (ids, slugs, what is authored elsewhere, creation times): accepted when
//!   they equal the resource's current value, refused when they differ, since that is an
//!   attempt to change what cannot change;
//! - **kept** fields, which the server maintains (`updatedAt`, delivery counters): accepted and
//!   ignored whatever they hold, since a round trip carries whatever they were when read and
//!   another writer may have moved them since.

use serde_json::{Map, Value};

/// The fixed fields a body echoes, taken out of `body`; kept fields are dropped from it.
pub(crate) fn take_echoed(body: &mut Map<String, Value>, fixed: &[&str], kept: &[&str]) -> Map<String, Value> {
    body.retain(|key, _| !kept.contains(&key.as_str()));
    let mut echoed = Map::new();
    for key in fixed {
        if let Some(value) = body.remove(*key) {
            echoed.insert((*key).to_owned(), value);
        }
    }
    echoed
}

/// The echoed fixed fields that differ from the resource as shown (`shown`, the document a
/// `GET` returns), with the value each has.
pub fn changed<'a>(echoed: &'a Map<String, Value>, shown: &'a Value) -> Vec<(&'a str, &'a Value)> {
    echoed
        .iter()
        .filter(|(key, value)| shown.get(key.as_str()) != Some(*value))
        .map(|(key, _)| (key.as_str(), shown.get(key.as_str()).unwrap_or(&Value::Null)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fixed_fields_are_taken_out_and_kept_fields_dropped() {
        let mut body =
            json!({"id": "x_1", "name": "n", "updatedAt": 5, "slug": "s"}).as_object().cloned().expect("obj");
        let echoed = take_echoed(&mut body, &["id", "slug", "createdAt"], &["updatedAt"]);
        assert_eq!(Value::Object(body), json!({"name": "n"}));
        assert_eq!(Value::Object(echoed.clone()), json!({"id": "x_1", "slug": "s"}));
        let shown = json!({"id": "x_1", "slug": "other", "name": "n"});
        assert_eq!(changed(&echoed, &shown), vec![("slug", &json!("other"))]);
        assert!(changed(&Map::new(), &shown).is_empty());
    }
}
