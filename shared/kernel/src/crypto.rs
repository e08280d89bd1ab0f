//! Crypto-shredding. A data subject's personal fields are encrypted in the log with
//! AES-256-GCM under the subject's own data key. Data keys are stored only wrapped (encrypted)
//! by the master key from configuration, in `subject_keys`. Erasing a subject deletes its
//! wrapped key: every copy of its data in the log becomes unreadable for good, and readers
//! treat it as erased.
//!
//! The keys and the sealing; the process-wide keyring and the stored keys' loading are
//! `platform::crypto`'s.

use std::collections::HashMap;

use aes_gcm::aead::rand_core::RngCore;
use aes_gcm::aead::{Aead, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use anyhow::Context;
use sha2::{Digest, Sha256};

const NONCE_LEN: usize = 12;
const KEY_LEN: usize = 32;

/// A master key for tests and local runs only; production sets `APP__MASTER_KEY`.
pub const TEST_MASTER_KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// The master key, which wraps and unwraps data keys.
#[derive(Clone)]
pub struct Keyring {
    master: Aes256Gcm,
    /// Derived from the master key: keys the digests that name email addresses as subjects.
    digest_key: [u8; 32],
}

/// One subject's data key.
#[derive(Clone)]
pub struct DataKey {
    /// Boxed: the expanded AES key schedule is large.
    cipher: Box<Aes256Gcm>,
}

impl Keyring {
    /// Parses a master key of 64 hexadecimal characters.
    pub fn from_hex(hex: &str) -> anyhow::Result<Self> {
        let bytes = hex::decode(hex.trim()).context("the master key must be 64 hexadecimal characters")?;
        anyhow::ensure!(bytes.len() == KEY_LEN, "the master key must be 64 hexadecimal characters (32 bytes)");
        let digest_key = Sha256::new().chain_update(b"email-subject-digest\0").chain_update(&bytes).finalize().into();
        Ok(Self { master: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&bytes)), digest_key })
    }

    /// The subject id that names an email address in the log without holding it: a keyed
    /// digest, so log rows about the address (suppressions, sends) can be found by it, and a
    /// dump of the database does not reveal it.
    pub fn email_subject(&self, email: &str) -> String {
        let digest = Sha256::new().chain_update(self.digest_key).chain_update(email.trim().to_lowercase()).finalize();
        format!("email:{}", hex::encode(&digest[..16]))
    }

    /// A keyed digest of `text` for `purpose` (hex): lets the write side compare or name a
    /// value (an event's input, an anonymous id) without storing it.
    pub fn digest(&self, purpose: &str, text: &str) -> String {
        let digest = Sha256::new()
            .chain_update(self.digest_key)
            .chain_update(purpose.as_bytes())
            .chain_update([0u8])
            .chain_update(text.as_bytes())
            .finalize();
        hex::encode(digest)
    }

    /// A secret key for `purpose`, derived from the master key (and for nothing else): the
    /// keys that sign tracking links. HMAC-SHA256 under the digest key, so no two purposes
    /// share a key and none reveals the master key.
    pub fn derive_key(&self, purpose: &str) -> [u8; 32] {
        use hmac::{KeyInit, Mac};
        let Ok(mut mac) = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(&self.digest_key) else {
            unreachable!("HMAC takes a key of any length")
        };
        mac.update(b"derived-key\0");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// A key of the system's own for `purpose` ([`Keyring::derive_key`]), as a data key: for
    /// data kept briefly before it is sealed under its subject's key (a click's target
    /// between the tracking endpoint and the log).
    pub fn system_key(&self, purpose: &str) -> DataKey {
        let bytes = self.derive_key(purpose);
        DataKey { cipher: Box::new(Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&bytes))) }
    }

    /// A fresh data key for `subject_id` and its wrapped form, to be stored.
    pub fn generate(&self, subject_id: &str) -> anyhow::Result<(DataKey, Vec<u8>)> {
        let bytes: [u8; KEY_LEN] = os_bytes();
        let wrapped = encrypt(&self.master, subject_id.as_bytes(), &bytes)?;
        let key = DataKey { cipher: Box::new(Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&bytes))) };
        Ok((key, wrapped))
    }

    /// Unwraps a stored data key. The subject id is bound in, so a key cannot be moved to
    /// another subject.
    pub fn unwrap_key(&self, subject_id: &str, wrapped: &[u8]) -> anyhow::Result<DataKey> {
        let bytes = decrypt(&self.master, subject_id.as_bytes(), wrapped)
            .with_context(|| format!("the data key of {subject_id} does not open with the master key"))?;
        anyhow::ensure!(bytes.len() == KEY_LEN, "the data key of {subject_id} has the wrong length");
        Ok(DataKey { cipher: Box::new(Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&bytes))) })
    }
}

impl DataKey {
    pub fn encrypt(&self, subject_id: &str, plaintext: &[u8]) -> anyhow::Result<Vec<u8>> {
        encrypt(&self.cipher, subject_id.as_bytes(), plaintext)
    }

    pub fn decrypt(&self, subject_id: &str, ciphertext: &[u8]) -> anyhow::Result<Vec<u8>> {
        decrypt(&self.cipher, subject_id.as_bytes(), ciphertext)
    }
}

/// `N` bytes from the operating system, for a nonce or a new key's bytes only (a value a
/// decision draws comes through `fresh::Fresh`).
fn os_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    OsRng.fill_bytes(&mut bytes);
    bytes
}

/// `nonce || ciphertext+tag`, with `aad` authenticated.
fn encrypt(cipher: &Aes256Gcm, aad: &[u8], plaintext: &[u8]) -> anyhow::Result<Vec<u8>> {
    let nonce: [u8; NONCE_LEN] = os_bytes();
    // Fails only for inputs beyond GCM's length limit (64 GiB).
    let sealed = cipher
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad })
        .map_err(|_| anyhow::anyhow!("encryption failed"))?;
    let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&sealed);
    Ok(out)
}

fn decrypt(cipher: &Aes256Gcm, aad: &[u8], bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    anyhow::ensure!(bytes.len() > NONCE_LEN, "ciphertext too short");
    let (nonce, sealed) = bytes.split_at(NONCE_LEN);
    cipher
        .decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad })
        .map_err(|_| anyhow::anyhow!("ciphertext failed authentication"))
}

/// The data keys of some subjects, as loaded for one decision or one projection batch. A
/// subject without a key here is erased (or was never encrypted).
#[derive(Clone, Default)]
pub struct Keys(HashMap<String, DataKey>);

impl Keys {
    pub fn get(&self, subject_id: &str) -> Option<&DataKey> {
        self.0.get(subject_id)
    }

    pub fn insert(&mut self, subject_id: String, key: DataKey) {
        self.0.insert(subject_id, key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operating_system_bytes_differ_each_time() {
        assert_ne!(os_bytes::<32>(), os_bytes::<32>());
    }

    #[test]
    fn data_keys_round_trip_and_are_bound_to_their_subject() {
        let keyring = Keyring::from_hex(TEST_MASTER_KEY).expect("valid key");
        let (key, wrapped) = keyring.generate("con_1").expect("generates");
        let unwrapped = keyring.unwrap_key("con_1", &wrapped).expect("unwraps");
        let sealed = key.encrypt("con_1", b"ada@example.com").expect("encrypts");
        assert!(!sealed.windows(3).any(|w| w == b"ada"), "ciphertext must not hold the clear text");
        assert_eq!(unwrapped.decrypt("con_1", &sealed).expect("opens"), b"ada@example.com");
        assert!(keyring.unwrap_key("con_2", &wrapped).is_err(), "a wrapped key opens only for its subject");
        assert!(unwrapped.decrypt("con_2", &sealed).is_err(), "ciphertext opens only for its subject");
    }

    #[test]
    fn email_subjects_are_keyed_and_normalised() {
        let keyring = Keyring::from_hex(TEST_MASTER_KEY).expect("valid key");
        let other = Keyring::from_hex(&"ab".repeat(32)).expect("valid key");
        let subject = keyring.email_subject("Ada@Example.com ");
        assert_eq!(subject, keyring.email_subject("ada@example.com"));
        assert!(subject.starts_with("email:") && !subject.contains("ada"));
        assert_ne!(subject, other.email_subject("ada@example.com"), "the digest depends on the master key");
    }

    #[test]
    fn a_malformed_master_key_is_refused() {
        assert!(Keyring::from_hex("abc").is_err());
        assert!(Keyring::from_hex(&"zz".repeat(32)).is_err());
        assert!(Keyring::from_hex(&"ab".repeat(16)).is_err());
    }
}
