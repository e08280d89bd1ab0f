//! Identifiers: the id types a decision's signature names what it takes by, and ids derived
//! from names. A new time-ordered id (decision D2) is drawn by `platform::ids::new_id`.

use sha2::{Digest, Sha256};

/// An id type: a `String` that says what it names, so a decision that takes a contact's id
/// cannot be handed an email's. It reads as the `str` it is (`Deref`), and is written and
/// read as a plain JSON string.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The id as a `str`.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id as a `String`.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                Self(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                Self(id.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> Self {
                id.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str(&self.0)
            }
        }

        /// Stored as the text it is.
        impl postgres_types::ToSql for $name {
            fn to_sql(
                &self,
                ty: &postgres_types::Type,
                out: &mut postgres_types::private::BytesMut,
            ) -> Result<postgres_types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
                self.0.to_sql(ty, out)
            }

            fn accepts(ty: &postgres_types::Type) -> bool {
                <String as postgres_types::ToSql>::accepts(ty)
            }

            postgres_types::to_sql_checked!();
        }

        impl<'a> postgres_types::FromSql<'a> for $name {
            fn from_sql(
                ty: &postgres_types::Type,
                raw: &'a [u8],
            ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                String::from_sql(ty, raw).map(Self)
            }

            fn accepts(ty: &postgres_types::Type) -> bool {
                <String as postgres_types::FromSql>::accepts(ty)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

id_type!(
    /// A space's id (`spc_…`): the tenant every write belongs to.
    SpaceId
);
id_type!(
    /// A contact's id (`con_…`): a record of a contact schema.
    ContactId
);
id_type!(
    /// An email's id (`em_…`).
    EmailId
);
id_type!(
    /// A workflow run's id (`run_…`).
    RunId
);

/// A stable identifier derived from names, so re-applying an authored resource keeps its id.
pub fn derived_id(prefix: &str, parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0x1f]);
    }
    let digest = hasher.finalize();
    format!("{prefix}_{}", hex::encode(&digest[..16]))
}

/// SHA-256 of a string as lowercase hex.
pub fn sha256_hex(input: &str) -> String {
    hex::encode(Sha256::digest(input.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_type_reads_as_its_string_and_is_a_plain_json_string() {
        let contact = ContactId::from("con_1");
        let as_str: &str = &contact;
        assert_eq!((as_str, contact.to_string()), ("con_1", "con_1".to_owned()));
        assert_eq!(serde_json::to_value(&contact).expect("serialized"), serde_json::json!("con_1"));
        assert_eq!(serde_json::from_value::<EmailId>(serde_json::json!("em_2")).expect("read"), EmailId::from("em_2"));
        let by_id: std::collections::HashMap<ContactId, u8> = [(contact.clone(), 1)].into();
        assert_eq!(by_id.get("con_1"), Some(&1), "looked up by the str it is");
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        assert_eq!(derived_id("sch", &["a", "b"]), derived_id("sch", &["a", "b"]));
        assert_ne!(derived_id("sch", &["a", "b"]), derived_id("sch", &["ab", ""]));
    }
}
