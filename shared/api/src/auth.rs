//! Authentication and authorisation as the contract's Authentication section says: bearer
//! keys matched by hash, space resolution, roles and their permissions.

use platform::error::Code;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::HttpRequest;
use deadpool_postgres::Pool;

use crate::http::{Credential, bearer_token};
use crate::ratelimit::{Bucket, RateLimiter};
use domain::catalog::{CATALOG, KeyIdentity, Membership};
pub use domain::roles::{Permission, Role};
use platform::error::ApiError;
use platform::ids::sha256_hex;
use platform::readmodel::ReadModels;
use platform::settings::RateLimits;

/// The prefix of every API key: keys look like `sk_<secret>`.
pub const KEY_PREFIX: &str = "sk";

/// The masked form of a key: prefix, three dots, last four characters.
pub fn key_display(full_key: &str) -> String {
    let prefix = full_key.split_once('_').map_or(KEY_PREFIX, |(prefix, _)| prefix);
    let chars: Vec<char> = full_key.chars().collect();
    let last_four: String = chars[chars.len().saturating_sub(4)..].iter().collect();
    format!("{prefix}_...{last_four}")
}

/// Resolves the space a key acts in, per the contract's rule 4.
pub(crate) fn resolve_space(identity: &KeyIdentity) -> Result<Membership, ApiError> {
    match &identity.bound_space_id {
        Some(space_id) => identity
            .memberships
            .iter()
            .find(|membership| &membership.space_id == space_id)
            .cloned()
            .ok_or_else(|| ApiError::forbidden("Space is out of scope")),
        None => match identity.memberships.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(ApiError::forbidden("the key's owner has no membership in any space")),
            _ => Err(ApiError::of(
                Code::UnknownSpace,
                "the key is not bound to a space and its owner belongs to several; use a key bound to one space",
            )),
        },
    }
}

/// Fails with 403 naming the permission when the role lacks it.
pub fn require(role: Role, permission: Permission) -> Result<(), ApiError> {
    if role.allows(permission) {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "the {} permission is required; the key's role {} does not have it",
            permission.name(),
            role.name()
        )))
    }
}

/// An authenticated caller acting in a resolved space.
#[derive(Debug, Clone)]
pub struct Caller {
    pub identity: Arc<KeyIdentity>,
    pub space: Membership,
}

impl Caller {
    pub fn key_id(&self) -> &str {
        &self.identity.key_id
    }

    pub fn space_id(&self) -> &str {
        &self.space.space_id
    }
}

const CACHE_CAPACITY: usize = 10_000;

type CacheEntry = (Instant, Option<Arc<KeyIdentity>>);

/// Looks keys up in the catalog read model, caching each lookup for a short time so that a
/// revoked key stops working within a second on every instance.
#[derive(Clone)]
pub struct Authenticator {
    pool: Pool,
    /// When `pool` is a standby: the primary, asked about a key the standby does not know
    /// (one created a moment ago, not replayed there yet).
    primary: Option<Pool>,
    read_models: ReadModels,
    ttl: Duration,
    cache: Arc<Mutex<HashMap<String, CacheEntry>>>,
    rate_limiter: RateLimiter,
}

impl Authenticator {
    pub fn new(pool: Pool, read_models: ReadModels, ttl: Duration, limits: RateLimits) -> Self {
        let rate_limiter = RateLimiter::new(pool.clone(), limits);
        Self { pool, primary: None, read_models, ttl, cache: Arc::default(), rate_limiter }
    }

    /// Keys are looked up on `standby` (its `read_models`), and on `primary` when the standby
    /// does not know them; rate-limit reservations are written on `primary`.
    pub fn on_standby(
        standby: Pool,
        primary: Pool,
        read_models: ReadModels,
        ttl: Duration,
        limits: RateLimits,
    ) -> Self {
        let rate_limiter = RateLimiter::new(primary.clone(), limits);
        Self { pool: standby, primary: Some(primary), read_models, ttl, cache: Arc::default(), rate_limiter }
    }

    /// The key's identity, with no space resolved (for `GET /me`). Counts the request in its
    /// bucket first (by hashed credential, or client IP without one).
    pub async fn identify(&self, req: &HttpRequest) -> Result<Arc<KeyIdentity>, ApiError> {
        self.identify_in(req, Bucket::for_request(req)).await
    }

    /// [`Self::identify`], counting the request in `bucket` (the operations that choose the
    /// AI bucket by their body).
    async fn identify_in(&self, req: &HttpRequest, bucket: Bucket) -> Result<Arc<KeyIdentity>, ApiError> {
        let credential = bearer_token(req);
        let token = match credential {
            Credential::Bearer(token) => Some(token),
            Credential::Missing | Credential::Malformed => None,
        };
        let key_hash = token.map(sha256_hex);
        let subject = match &key_hash {
            Some(hash) => hash.clone(),
            None => format!("ip:{}", req.peer_addr().map(|addr| addr.ip().to_string()).unwrap_or_default()),
        };
        self.rate_limiter.check(bucket, &subject).await?;
        let (Some(token), Some(key_hash)) = (token, key_hash) else {
            return Err(match credential {
                Credential::Malformed => {
                    ApiError::invalid_api_key("the Authorization header must be `Authorization: Bearer <key>`")
                }
                _ => ApiError::missing_api_key(),
            });
        };
        if !token.starts_with(KEY_PREFIX) || !token.contains('_') || token.len() > 512 {
            return Err(ApiError::invalid_api_key("invalid key"));
        }
        if let Some(cached) = self.cached(&key_hash) {
            return cached.ok_or_else(|| ApiError::invalid_api_key("invalid key"));
        }
        let models = self.read_models.wait_for(&[CATALOG], 0, Duration::from_secs(2)).await?;
        let schema = models.schema(CATALOG);
        let client = self.pool.get().await?;
        let mut found = reads::catalog::find_key(&client, &schema, &key_hash).await?;
        drop(client);
        if found.is_none()
            && let Some(primary) = &self.primary
        {
            found = self.find_on_primary(primary, &schema, &key_hash).await;
        }
        let found = found.map(Arc::new);
        self.store(key_hash, found.clone());
        found.ok_or_else(|| ApiError::invalid_api_key("invalid key"))
    }

    /// Counts a request of a credential that is no API key (a write key, by `subject`) in
    /// `bucket`: 429 `rate_limit_exceeded` with `Retry-After` over its budget.
    pub async fn count(&self, bucket: Bucket, subject: &str) -> Result<(), ApiError> {
        self.rate_limiter.check(bucket, subject).await
    }

    /// Authenticates, resolves the space and checks the permission.
    pub async fn authorize(&self, req: &HttpRequest, permission: Permission) -> Result<Caller, ApiError> {
        self.authorize_in(req, permission, Bucket::for_request(req)).await
    }

    /// [`Self::authorize`], counting the request in `bucket`.
    pub async fn authorize_in(
        &self,
        req: &HttpRequest,
        permission: Permission,
        bucket: Bucket,
    ) -> Result<Caller, ApiError> {
        let identity = self.identify_in(req, bucket).await?;
        let space = resolve_space(&identity)?;
        require(space.role, permission)?;
        Ok(Caller { identity, space })
    }

    /// A key the standby does not know, looked up on the primary: a key is usable as soon as
    /// the primary's catalog has it, as without a standby. Unknown there too, or the primary
    /// unreachable or without the standby's catalog version, it stays unknown.
    async fn find_on_primary(&self, primary: &Pool, schema: &str, key_hash: &str) -> Option<KeyIdentity> {
        let looked_up = async {
            let client = primary.get().await.map_err(anyhow::Error::from)?;
            anyhow::Ok(reads::catalog::find_key(&client, schema, key_hash).await?)
        };
        looked_up.await.unwrap_or_else(|error| {
            tracing::warn!(error = %error, "a key unknown to the standby could not be looked up on the primary");
            None
        })
    }

    fn cached(&self, key_hash: &str) -> Option<Option<Arc<KeyIdentity>>> {
        let cache = self.cache.lock().ok()?;
        let (stored_at, identity) = cache.get(key_hash)?;
        (stored_at.elapsed() < self.ttl).then(|| identity.clone())
    }

    fn store(&self, key_hash: String, identity: Option<Arc<KeyIdentity>>) {
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHE_CAPACITY {
                cache.retain(|_, (stored_at, _)| stored_at.elapsed() < self.ttl);
                if cache.len() >= CACHE_CAPACITY {
                    cache.clear();
                }
            }
            cache.insert(key_hash, (Instant::now(), identity));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn identity(bound: Option<&str>, spaces: &[(&str, Role)]) -> KeyIdentity {
        KeyIdentity {
            key_id: "key_1".into(),
            name: "k".into(),
            key_display: "sk_...abcd".into(),
            created_at: Utc::now(),
            user_id: "usr_1".into(),
            user_name: "U".into(),
            user_email: "u@example.com".into(),
            bound_space_id: bound.map(str::to_owned),
            bound_space: None,
            memberships: spaces
                .iter()
                .map(|(id, role)| Membership {
                    space_id: (*id).into(),
                    slug: "s".into(),
                    name: "S".into(),
                    role: *role,
                })
                .collect(),
        }
    }

    #[test]
    fn roles_have_the_contract_permissions() {
        assert!(Role::Admin.allows(Permission::Write) && Role::Admin.allows(Permission::Admin));
        assert!(!Role::NonPaidAdmin.allows(Permission::Write) && Role::NonPaidAdmin.allows(Permission::Admin));
        assert!(Role::Member.allows(Permission::Write) && !Role::Member.allows(Permission::Admin));
        let error = require(Role::Member, Permission::Admin).expect_err("member lacks admin");
        assert!(error.message().contains("admin"));
    }

    #[test]
    fn bound_key_uses_its_space_or_is_out_of_scope() {
        let ok = resolve_space(&identity(Some("spc_a"), &[("spc_a", Role::Member), ("spc_b", Role::Admin)]));
        assert_eq!(ok.expect("in scope").role, Role::Member);
        let error = resolve_space(&identity(Some("spc_c"), &[("spc_a", Role::Member)])).expect_err("out of scope");
        assert_eq!(error.message(), "Space is out of scope");
        assert_eq!(error.status().as_u16(), 403);
    }

    #[test]
    fn unbound_key_needs_exactly_one_membership() {
        assert!(resolve_space(&identity(None, &[("spc_a", Role::Admin)])).is_ok());
        let several = resolve_space(&identity(None, &[("spc_a", Role::Admin), ("spc_b", Role::Admin)]));
        assert_eq!(several.expect_err("several").code(), Some(Code::UnknownSpace));
        let none = resolve_space(&identity(None, &[])).expect_err("none");
        assert_eq!(none.status().as_u16(), 403);
    }

    #[test]
    fn key_display_masks_all_but_prefix_and_last_four() {
        assert_eq!(key_display("sk_abcdefghijklmnopqrstuvwxyz1234"), "sk_...1234");
    }
}
