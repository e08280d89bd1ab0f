//! Write keys at the door: a request's key (`Authorization: Basic base64(key:)`, as Segment's
//! clients send it, or `writeKey` in the body) looked up by its hash among the catalog's
//! `write_key` resources, each lookup kept for a moment so a withdrawn key stops within a
//! second on every instance, as an API key does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use base64::Engine;

pub use super::write_key::WriteKey;
use crate::State;

/// The key a request presents: the user of HTTP Basic (the password is empty; Segment's
/// clients send `base64(key + ":")`), else none (the body's `writeKey` is read with the body).
pub fn basic_key(header: Option<&str>) -> Option<String> {
    let encoded = header?.trim().strip_prefix("Basic ").or_else(|| header?.trim().strip_prefix("basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let key = text.split_once(':').map_or(text.as_str(), |(user, _)| user);
    (!key.is_empty()).then(|| key.to_owned())
}

const CACHE_CAPACITY: usize = 10_000;

type Entry = (Instant, Option<Arc<WriteKey>>);

/// Write keys looked up by hash, each kept for the auth cache's time.
#[derive(Default)]
pub struct WriteKeys {
    cache: Mutex<HashMap<String, Entry>>,
}

impl WriteKeys {
    /// The enabled write key whose secret is `key`, if any.
    pub async fn find(&self, state: &State, key: &str) -> Result<Option<Arc<WriteKey>>, platform::error::ApiError> {
        let hash = platform::ids::sha256_hex(key);
        let ttl = state.settings.auth_cache_ttl();
        if let Some((stored_at, found)) = self.cache.lock().ok().and_then(|cache| cache.get(&hash).cloned())
            && stored_at.elapsed() < ttl
        {
            return Ok(found);
        }
        let catalog = crate::pipeline::edge_catalog(state).await?;
        let client = state.pool.get().await?;
        let found = reads::catalog::find_write_key(&client, &catalog, &hash)
            .await?
            .and_then(|(id, space_id, definition)| WriteKey::of(id, space_id, &definition))
            .map(Arc::new);
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHE_CAPACITY {
                cache.retain(|_, (stored_at, _)| stored_at.elapsed() < ttl);
                if cache.len() >= CACHE_CAPACITY {
                    cache.clear();
                }
            }
            cache.insert(hash, (Instant::now(), found.clone()));
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_key_is_the_basic_users_and_a_disabled_key_is_none() {
        let header = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("wk_abc:"));
        assert_eq!(basic_key(Some(&header)).as_deref(), Some("wk_abc"));
        let with_password = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("wk_abc:ignored"));
        assert_eq!(basic_key(Some(&with_password)).as_deref(), Some("wk_abc"));
        assert_eq!(basic_key(Some("Bearer sk_x")), None);
        assert_eq!(basic_key(Some("Basic !!!")), None);
        assert_eq!(basic_key(None), None);

        let definition = json!({"slug": "web", "source": "web", "contactSchemaId": "sch_c",
                                "events": {"Signed Up": "sch_e"}, "pageSchemaId": null,
                                "group": {"schemaId": "sch_o", "contactAttribute": "companyId"}, "enabled": true});
        let key = WriteKey::of("wrk_1".into(), "spc_1".into(), &definition).expect("enabled");
        assert_eq!(key.events["Signed Up"], "sch_e");
        assert_eq!(key.group, Some(("sch_o".to_owned(), "companyId".to_owned())));
        assert_eq!(key.page_schema_id, None);
        let mut disabled = definition;
        disabled["enabled"] = json!(false);
        assert_eq!(WriteKey::of("wrk_1".into(), "spc_1".into(), &disabled), None);
    }
}
