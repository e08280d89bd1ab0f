//! The process's source of a decision's new values ([`Drawn`]); the trait and the tests'
//! source are `kernel::fresh`'s, re-exported here.

pub use kernel::fresh::*;

use crate::crypto::DataKey;

/// The process's new values: [`crate::ids::new_id`] and the installed keyring.
pub struct Drawn;

impl Fresh for Drawn {
    fn id(&mut self, prefix: &str) -> String {
        crate::ids::new_id(prefix)
    }

    fn data_key(&mut self, subject_id: &str) -> anyhow::Result<(DataKey, Vec<u8>)> {
        crate::crypto::keyring()?.generate(subject_id)
    }

    fn uuid(&mut self) -> uuid::Uuid {
        uuid::Uuid::new_v4()
    }

    fn token(&mut self, purpose: &str) -> anyhow::Result<(String, String)> {
        use base64::Engine;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(crate::crypto::random_bytes::<32>());
        let digest = crate::crypto::keyring()?.digest(purpose, &token);
        Ok((token, digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Keyring;

    #[test]
    fn a_drawn_token_is_fresh_each_time_43_characters_and_stored_by_its_keyed_digest() {
        crate::crypto::install(Keyring::from_hex(crate::crypto::TEST_MASTER_KEY).expect("a test keyring"));
        let (first, digest) = Drawn.token("form-token").expect("a token");
        let (second, _) = Drawn.token("form-token").expect("a token");
        assert_ne!(first, second);
        assert_eq!(first.len(), 43);
        assert!(first.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'), "{first}");
        assert_eq!(digest, crate::crypto::keyed_digest("form-token", &first).expect("a digest"));
        assert_ne!(digest, crate::crypto::keyed_digest("other", &first).expect("a digest"), "bound to its purpose");
    }
}
