//! Standard Webhooks signing (decision D4): `webhook-signature` is `v1,<base64 HMAC-SHA256 of
//! "{id}.{timestamp}.{body}">`, several space-separated while a rotation's grace period lets
//! the previous secret sign too. Secrets are `whsec_` and the base64 of their bytes.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{KeyInit, Mac};

type Hmac = hmac::Hmac<sha2::Sha256>;

const PREFIX: &str = "whsec_";
/// Bytes of a generated secret.
const GENERATED_LEN: usize = 32;
/// Lengths Standard Webhooks allows for a secret's bytes.
const ALLOWED_LEN: std::ops::RangeInclusive<usize> = 24..=64;

/// A signing secret. Its bytes never appear in `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// A new secret of the 32 random bytes the caller drew (`kernel::crypto::random_bytes`).
    pub fn from_random(bytes: [u8; GENERATED_LEN]) -> Self {
        Self(bytes.to_vec())
    }

    /// Reads `whsec_<base64>`; `None` when the text is not a secret.
    pub fn parse(text: &str) -> Option<Self> {
        let bytes = STANDARD.decode(text.strip_prefix(PREFIX)?).ok()?;
        ALLOWED_LEN.contains(&bytes.len()).then_some(Self(bytes))
    }

    /// The secret as given to the webhook's owner: `whsec_<base64>`.
    pub fn reveal(&self) -> String {
        format!("{PREFIX}{}", STANDARD.encode(&self.0))
    }

    /// `v1,<base64 signature>` of one delivery attempt.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        // A key no longer than the block (64 bytes; secrets are at most that) is zero-padded to
        // it (RFC 2104), which makes the keying infallible.
        let mut key = hmac::digest::Key::<Hmac>::default();
        for (slot, byte) in key.iter_mut().zip(&self.0) {
            *slot = *byte;
        }
        let mut mac = Hmac::new(&key);
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Secret(..)")
    }
}

/// The `webhook-signature` header: one signature per secret, space-separated (the current
/// secret first, then any still in their grace period).
pub fn signature_header<'a>(
    secrets: impl IntoIterator<Item = &'a Secret>,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets.into_iter().map(|secret| secret.sign(id, timestamp, body)).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification (its secret, id, timestamp and body),
    /// whose signature was also computed independently with Python's `hmac`.
    #[test]
    fn signs_the_specification_example() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("a secret");
        let signature = secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#);
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn zero_padded_keys_sign_as_hmac_keys_of_their_own_length() {
        for length in [24, 32, 63, 64] {
            let secret = Secret((0..length).map(|byte| byte as u8 + 1).collect());
            let mut mac = <Hmac as KeyInit>::new_from_slice(&secret.0).expect("any key length");
            mac.update(b"msg_1.5.{}");
            assert_eq!(secret.sign("msg_1", 5, b"{}"), format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes())));
        }
    }

    #[test]
    fn every_input_changes_the_signature() {
        let secret = Secret::from_random([1; 32]);
        let base = secret.sign("msg_1", 1, b"{}");
        assert_ne!(base, secret.sign("msg_2", 1, b"{}"));
        assert_ne!(base, secret.sign("msg_1", 2, b"{}"));
        assert_ne!(base, secret.sign("msg_1", 1, b"{ }"));
        assert_ne!(base, Secret::from_random([2; 32]).sign("msg_1", 1, b"{}"));
    }

    #[test]
    fn generated_secrets_round_trip_and_stay_out_of_debug() {
        let secret = Secret::from_random([7; 32]);
        let shown = secret.reveal();
        assert!(shown.starts_with("whsec_"));
        assert_eq!(Secret::parse(&shown), Some(secret.clone()));
        assert_eq!(format!("{secret:?}"), "Secret(..)");
        assert_ne!(Secret::from_random([8; 32]), secret);
    }

    #[test]
    fn malformed_secrets_are_refused() {
        assert_eq!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), None, "no prefix");
        assert_eq!(Secret::parse("whsec_not base64!"), None);
        assert_eq!(Secret::parse("whsec_c2hvcnQ="), None, "too short");
    }

    #[test]
    fn a_rotation_signs_with_each_secret_in_order() {
        let (current, previous) = (Secret::from_random([3; 32]), Secret::from_random([4; 32]));
        let header = signature_header([&current, &previous], "msg_1", 7, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts, [current.sign("msg_1", 7, b"{}"), previous.sign("msg_1", 7, b"{}")]);
    }
}
