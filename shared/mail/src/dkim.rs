//! DKIM keys of sending domains: generated (RSA 2048) or given in the workspace file, kept
//! only encrypted (a data key of its own, wrapped by the master key, next to the ciphertext in
//! the domain's definition), and the DNS records a domain must publish.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use domain::email::resources::StoredKey;
use platform::crypto::Keyring;
use rsa::pkcs1::{DecodeRsaPrivateKey, EncodeRsaPrivateKey};
use rsa::pkcs8::{DecodePrivateKey, EncodePublicKey, LineEnding};
use rsa::{RsaPrivateKey, RsaPublicKey};

fn subject(domain_id: &str) -> String {
    format!("domain-{domain_id}")
}

/// A fresh RSA 2048 key, as PKCS#1 PEM.
pub fn generate() -> anyhow::Result<String> {
    let key = RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048)?;
    Ok(key.to_pkcs1_pem(LineEnding::LF)?.to_string())
}

/// Reads a PEM private key (PKCS#1 or PKCS#8) and answers it as PKCS#1 PEM with its public key.
pub fn parse(pem: &str) -> anyhow::Result<(String, String)> {
    let key = RsaPrivateKey::from_pkcs1_pem(pem).or_else(|_| RsaPrivateKey::from_pkcs8_pem(pem))?;
    let public = STANDARD.encode(RsaPublicKey::from(&key).to_public_key_der()?.as_bytes());
    Ok((key.to_pkcs1_pem(LineEnding::LF)?.to_string(), public))
}

/// Encrypts a domain's key for its definition.
pub fn seal(keyring: &Keyring, domain_id: &str, selector: &str, pem: &str) -> anyhow::Result<StoredKey> {
    let (pkcs1, public_key) = parse(pem)?;
    let subject = subject(domain_id);
    let (key, wrapped) = keyring.generate(&subject)?;
    let ciphertext = key.encrypt(&subject, pkcs1.as_bytes())?;
    Ok(StoredKey {
        selector: selector.to_owned(),
        public_key,
        wrapped_key: STANDARD.encode(wrapped),
        private_key: STANDARD.encode(ciphertext),
    })
}

/// The PKCS#1 PEM of a stored key.
pub fn open(keyring: &Keyring, domain_id: &str, stored: &StoredKey) -> anyhow::Result<String> {
    let subject = subject(domain_id);
    let key = keyring.unwrap_key(&subject, &STANDARD.decode(&stored.wrapped_key)?)?;
    let pem = key.decrypt(&subject, &STANDARD.decode(&stored.private_key)?)?;
    Ok(String::from_utf8(pem)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_key_opens_to_the_same_key_and_keeps_its_public_half() {
        let keyring = Keyring::from_hex(platform::crypto::TEST_MASTER_KEY).expect("key");
        let pem = generate().expect("generates");
        let stored = seal(&keyring, "dom_1", "s1", &pem).expect("seals");
        assert!(!stored.private_key.contains("PRIVATE"));
        let opened = open(&keyring, "dom_1", &stored).expect("opens");
        assert_eq!(opened, pem);
        assert_eq!(parse(&opened).expect("parses").1, stored.public_key);
        assert!(open(&keyring, "dom_2", &stored).is_err(), "bound to its domain");
    }
}
