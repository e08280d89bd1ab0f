//! DKIM signatures (RFC 6376): `rsa-sha256`, relaxed/relaxed canonicalization, over a
//! message's bytes as lettre formats them, signed with `aws-lc-rs`.
//!
//! Why not lettre's own signer: it signs with the pure-Rust `rsa` crate, which took 1.86 ms
//! per message on this machine kind, and signing is the largest single cost of a message in
//! every sender. `ring` (linked by rustls) took 0.58 ms; AWS-LC 0.27 ms, with its RSA-2048
//! exponentiation on AVX-512 IFMA where the CPU has it (it falls back to the same ADX/BMI2
//! code as `ring` where it does not). The canonicalization is small and fully specified;
//! every email test has dkimpy verify the result, so an independent implementation holds
//! this one to the RFC.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use anyhow::Context;
use aws_lc_rs::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rsa::pkcs1::{DecodeRsaPrivateKey, EncodeRsaPrivateKey};
use sha2::{Digest, Sha256};

/// A domain's signing key, parsed once per process.
pub(crate) struct Signer {
    key: RsaKeyPair,
    selector: String,
    domain: String,
}

/// Signers by (selector, domain, digest of the PEM): parsing a key costs more than a
/// signature.
type SignerKey = (String, String, [u8; 32]);
static SIGNERS: LazyLock<Mutex<HashMap<SignerKey, Arc<Signer>>>> = LazyLock::new(Default::default);

impl Signer {
    /// The signer of `pem` (PKCS#1) for `selector._domainkey.domain`.
    pub(crate) fn new(pem: &str, selector: &str, domain: &str) -> anyhow::Result<Self> {
        let der = rsa::RsaPrivateKey::from_pkcs1_pem(pem)
            .context("the domain's DKIM key")?
            .to_pkcs1_der()
            .context("the domain's DKIM key")?;
        let key =
            RsaKeyPair::from_der(der.as_bytes()).map_err(|error| anyhow::anyhow!("the domain's DKIM key: {error}"))?;
        Ok(Self { key, selector: selector.to_owned(), domain: domain.to_owned() })
    }

    /// [`Signer::new`], kept per process.
    pub(crate) fn cached(pem: &str, selector: &str, domain: &str) -> anyhow::Result<Arc<Self>> {
        let digest: [u8; 32] = Sha256::digest(pem.as_bytes()).into();
        let key = (selector.to_owned(), domain.to_owned(), digest);
        if let Some(signer) = SIGNERS.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return Ok(Arc::clone(signer));
        }
        let signer = Arc::new(Self::new(pem, selector, domain)?);
        SIGNERS.lock().unwrap_or_else(PoisonError::into_inner).insert(key, Arc::clone(&signer));
        Ok(signer)
    }

    /// The `DKIM-Signature` header field (with its CRLF) for `message` (headers, a blank
    /// line, the body; CRLF line ends), signing the fields named in `headers` and time
    /// `timestamp` (Unix seconds).
    pub(crate) fn sign(&self, message: &[u8], headers: &[&str], timestamp: u64) -> anyhow::Result<String> {
        let (head, body) = split(message);
        let body_hash = STANDARD.encode(Sha256::digest(relaxed_body(body)));
        let fields = fields(head);
        let mut signed = Vec::new();
        let mut used = vec![false; fields.len()];
        let mut names = Vec::new();
        for name in headers {
            // The last instance not yet signed (RFC 6376 5.4.2).
            let found = (0..fields.len()).rev().find(|&i| !used[i] && fields[i].0.eq_ignore_ascii_case(name));
            if let Some(index) = found {
                used[index] = true;
                signed.extend_from_slice(relaxed_header(fields[index].0, fields[index].1).as_bytes());
                signed.extend_from_slice(b"\r\n");
            }
            names.push(name.to_ascii_lowercase());
        }
        let value = format!(
            "v=1; a=rsa-sha256; c=relaxed/relaxed; d={}; s={}; t={timestamp}; h={}; bh={body_hash}; b=",
            self.domain,
            self.selector,
            names.join(":"),
        );
        signed.extend_from_slice(relaxed_header("DKIM-Signature", &value).as_bytes());
        let mut signature = vec![0; self.key.public_modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &aws_lc_rs::rand::SystemRandom::new(), &signed, &mut signature)
            .map_err(|_| anyhow::anyhow!("DKIM signing failed"))?;
        // Folded at the tag separators, which relaxed canonicalization reads as one space.
        let folded = value.replace("; ", ";\r\n\t");
        Ok(format!("DKIM-Signature: {folded}{}\r\n", STANDARD.encode(signature)))
    }
}

/// The header block (without the blank line) and the body.
fn split(message: &[u8]) -> (&[u8], &[u8]) {
    match message.windows(4).position(|window| window == b"\r\n\r\n") {
        Some(at) => (&message[..at], &message[at + 4..]),
        None => (message, &[]),
    }
}

/// The header fields: (name, raw value with its folding).
fn fields(head: &[u8]) -> Vec<(&str, &str)> {
    let text = std::str::from_utf8(head).unwrap_or_default();
    let mut fields: Vec<&str> = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive("\r\n") {
        // A line that starts with whitespace continues the field before it.
        if offset > 0 && !line.starts_with([' ', '\t']) {
            fields.push(&text[start..offset]);
            start = offset;
        }
        offset += line.len();
    }
    if !text.is_empty() {
        fields.push(&text[start..]);
    }
    fields.into_iter().filter_map(|field| field.trim_end_matches("\r\n").split_once(':')).collect()
}

/// A header field in relaxed canonical form, without the CRLF: the name lowercased, the
/// value unfolded, whitespace runs as one space, no whitespace at its ends.
fn relaxed_header(name: &str, value: &str) -> String {
    let unfolded = value.replace("\r\n", "");
    format!("{}:{}", name.trim().to_ascii_lowercase(), collapse(&unfolded).trim_matches(' '))
}

/// A body in relaxed canonical form: whitespace runs as one space, none at line ends, no
/// empty lines at the end, and a final CRLF unless empty.
fn relaxed_body(body: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    let mut lines: Vec<String> =
        text.split("\r\n").map(|line| collapse(line).trim_end_matches(' ').to_owned()).collect();
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    let mut out = Vec::with_capacity(body.len());
    for line in lines {
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Every run of spaces and tabs as one space.
fn collapse(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_space = false;
    for c in text.chars() {
        if c == ' ' || c == '\t' {
            if !in_space {
                out.push(' ');
            }
            in_space = true;
        } else {
            out.push(c);
            in_space = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relaxed_canonicalization_follows_rfc_6376() {
        // RFC 6376 3.4.5's example.
        let message = b"A: X\r\nB : Y\t\r\n\tZ  \r\n\r\n C \r\nD \t E\r\n\r\n\r\n";
        let (head, body) = split(message);
        let canonical: Vec<String> = fields(head).into_iter().map(|(n, v)| relaxed_header(n, v)).collect();
        assert_eq!(canonical, ["a:X", "b:Y Z"]);
        assert_eq!(relaxed_body(body), b" C\r\nD E\r\n");
        assert_eq!(relaxed_body(b""), b"");
        assert_eq!(relaxed_body(b"\r\n\r\n"), b"");
    }

    #[test]
    fn a_signature_verifies_with_the_public_key_over_the_canonical_form() {
        let pem = crate::dkim::generate().expect("a key");
        let signer = Signer::new(&pem, "k1", "example.test").expect("a signer");
        let message = b"From: Ada <ada@example.test>\r\nTo: b@example.net\r\nSubject: Hi\r\n\r\nHello\r\n";
        let header = signer.sign(message, &["From", "To", "Subject", "Date"], 1_700_000_000).expect("signed");
        assert!(header.starts_with("DKIM-Signature: v=1;\r\n\ta=rsa-sha256;"), "{header}");
        assert!(header.contains("h=from:to:subject:date;"), "{header}");
        // What a verifier hashes: the signed fields, then the signature field with an empty b=.
        let header = header.trim_end();
        let (_, b) = header.rsplit_once("b=").expect("b=");
        let (name, value) = header[..header.len() - b.len()].split_once(':').expect("a field");
        let mut data = b"from:Ada <ada@example.test>\r\nto:b@example.net\r\nsubject:Hi\r\n".to_vec();
        data.extend_from_slice(relaxed_header(name, value).as_bytes());
        // Verified by `ring`, an implementation apart from the signer's.
        let public = ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            aws_lc_rs::signature::KeyPair::public_key(&signer.key).as_ref().to_vec(),
        );
        public.verify(&data, &STANDARD.decode(b).expect("base64")).expect("the signature verifies");
    }
}
