//! What a decision draws that is new each time it decides: ids, data keys and secret tokens.
//! A decision is given a [`Fresh`] rather than reaching for the process's id source or
//! keyring, so the same inputs decide the same: the process gives `platform::fresh::Drawn`
//! (time-ordered ids, keys from the installed keyring), a test [`Counted`] (ids numbered in
//! order, keys under a keyring of its own).

use crate::crypto::{DataKey, Keyring};

/// The source of a decision's new values.
pub trait Fresh {
    /// A new id with `prefix` (`con`, `obj`, `em`, ...).
    fn id(&mut self, prefix: &str) -> String;

    /// A new data key for `subject_id`, with its wrapped form to store.
    fn data_key(&mut self, subject_id: &str) -> anyhow::Result<(DataKey, Vec<u8>)>;

    /// A new random UUID (version 4), for an id the contract says is a UUID (a generated
    /// eventId).
    fn uuid(&mut self) -> uuid::Uuid;

    /// A new secret token (a link's: 32 random bytes, base64url without padding) and its
    /// keyed digest for `purpose` ([`crate::crypto::Keyring::digest`]), the only form of it
    /// stored.
    fn token(&mut self, purpose: &str) -> anyhow::Result<(String, String)>;
}

/// New values for tests: ids `<prefix>_1`, `<prefix>_2`, ... in the order they are drawn
/// (one count for every prefix, and for UUIDs), and keys under
/// [`crate::crypto::TEST_MASTER_KEY`], with no keyring installed.
pub struct Counted {
    drawn: u64,
    keyring: Keyring,
}

impl Counted {
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self { drawn: 0, keyring: Keyring::from_hex(crate::crypto::TEST_MASTER_KEY)? })
    }
}

impl Fresh for Counted {
    fn id(&mut self, prefix: &str) -> String {
        self.drawn += 1;
        format!("{prefix}_{}", self.drawn)
    }

    fn data_key(&mut self, subject_id: &str) -> anyhow::Result<(DataKey, Vec<u8>)> {
        self.keyring.generate(subject_id)
    }

    /// A version 4 UUID whose random bits are the count.
    fn uuid(&mut self) -> uuid::Uuid {
        self.drawn += 1;
        uuid::Builder::from_random_bytes(u128::from(self.drawn).to_be_bytes()).into_uuid()
    }

    /// `token_<n>`, digested under the test keyring.
    fn token(&mut self, purpose: &str) -> anyhow::Result<(String, String)> {
        self.drawn += 1;
        let token = format!("token_{}", self.drawn);
        let digest = self.keyring.digest(purpose, &token);
        Ok((token, digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_ids_are_numbered_in_the_order_drawn_and_the_same_on_every_run() {
        let mut first = Counted::new().expect("a test keyring");
        let mut second = Counted::new().expect("a test keyring");
        let drawn = [first.id("con"), first.id("em"), first.id("con")];
        assert_eq!(drawn, ["con_1", "em_2", "con_3"]);
        assert_eq!([second.id("con"), second.id("em"), second.id("con")], drawn);
        let uuid = first.uuid();
        assert_eq!((uuid.get_version_num(), uuid.as_u128() & 0xff), (4, 4), "the fourth value drawn");
    }

    #[test]
    fn a_counted_data_key_opens_with_the_test_master_key_for_its_subject_only() {
        let (key, wrapped) = Counted::new().expect("a test keyring").data_key("con_1").expect("a data key");
        let keyring = Keyring::from_hex(crate::crypto::TEST_MASTER_KEY).expect("the test key");
        let sealed = key.encrypt("con_1", b"ada").expect("sealed");
        let unwrapped = keyring.unwrap_key("con_1", &wrapped).expect("the key unwraps for its subject");
        assert_eq!(unwrapped.decrypt("con_1", &sealed).expect("opened"), b"ada");
        assert!(keyring.unwrap_key("con_2", &wrapped).is_err(), "bound to its subject");
    }
}
