//! Typed log events: the name each payload is stored under, and sealing of personal data.

use prost::Message;

use crate::proto;

/// Every event type the log holds. Types are stored by name with a `.v1` suffix; a breaking
/// change is a new message and a new name.
#[derive(Debug, Clone, PartialEq)]
pub enum LogEvent {
    SpaceDefined(proto::SpaceDefined),
    UserDefined(proto::UserDefined),
    MembershipGranted(proto::MembershipGranted),
    MembershipRevoked(proto::MembershipRevoked),
    ApiKeyIssued(proto::ApiKeyIssued),
    ApiKeyRevoked(proto::ApiKeyRevoked),
    SchemaDefined(proto::SchemaDefined),
    AiCreditsSet(proto::AiCreditsSet),
    ResourceDefined(proto::ResourceDefined),
    RecordCreated(proto::RecordCreated),
    RecordUpdated(proto::RecordUpdated),
    SuppressionAdded(proto::SuppressionAdded),
    SuppressionRemoved(proto::SuppressionRemoved),
    /// A type this build does not know (written by a newer build); projections skip it.
    Unknown(String),
}

macro_rules! event_types {
    ($($variant:ident => $name:literal),* $(,)?) => {
        impl LogEvent {
            pub fn event_type(&self) -> &str {
                match self {
                    $(Self::$variant(_) => $name,)*
                    Self::Unknown(name) => name,
                }
            }

            pub fn encode(&self) -> Vec<u8> {
                match self {
                    $(Self::$variant(message) => message.encode_to_vec(),)*
                    Self::Unknown(_) => Vec::new(),
                }
            }

            pub fn decode(event_type: &str, payload: &[u8]) -> Result<Self, prost::DecodeError> {
                Ok(match event_type {
                    $($name => Self::$variant(Message::decode(payload)?),)*
                    other => Self::Unknown(other.to_owned()),
                })
            }
        }
    };
}

event_types! {
    SpaceDefined => "SpaceDefined.v1",
    UserDefined => "UserDefined.v1",
    MembershipGranted => "MembershipGranted.v1",
    MembershipRevoked => "MembershipRevoked.v1",
    ApiKeyIssued => "ApiKeyIssued.v1",
    ApiKeyRevoked => "ApiKeyRevoked.v1",
    SchemaDefined => "SchemaDefined.v1",
    AiCreditsSet => "AiCreditsSet.v1",
    ResourceDefined => "ResourceDefined.v1",
    RecordCreated => "RecordCreated.v1",
    RecordUpdated => "RecordUpdated.v1",
    SuppressionAdded => "SuppressionAdded.v1",
    SuppressionRemoved => "SuppressionRemoved.v1",
}

/// Wraps a subject's personal data. Today it is stored in the open; the erasure feature
/// encrypts it here under the subject's data key, and nothing else has to change.
pub fn seal<M: Message>(subject_id: &str, personal: &M) -> proto::Sealed {
    proto::Sealed {
        body: Some(proto::sealed::Body::Clear(personal.encode_to_vec())),
        subject_id: subject_id.to_owned(),
    }
}

/// The personal data inside a seal; `None` once it is erased (or absent).
pub fn open<M: Message + Default>(sealed: Option<&proto::Sealed>) -> Result<Option<M>, prost::DecodeError> {
    match sealed.and_then(|sealed| sealed.body.as_ref()) {
        Some(proto::sealed::Body::Clear(bytes)) => Ok(Some(M::decode(bytes.as_slice())?)),
        Some(proto::sealed::Body::Ciphertext(_)) | None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_their_stored_name() {
        let event = LogEvent::SpaceDefined(proto::SpaceDefined {
            space_id: "spc_1".into(),
            slug: "main".into(),
            name: "Main".into(),
        });
        let decoded = LogEvent::decode(event.event_type(), &event.encode()).expect("decodes");
        assert_eq!(decoded, event);
    }

    #[test]
    fn unknown_types_decode_as_unknown() {
        let decoded = LogEvent::decode("FutureThing.v9", b"\x01").expect("unknown is not an error");
        assert_eq!(decoded, LogEvent::Unknown("FutureThing.v9".into()));
    }

    #[test]
    fn sealed_personal_data_opens() {
        let personal = proto::UserPersonal { name: "Ada".into(), email: "ada@example.com".into() };
        let sealed = seal("usr_1", &personal);
        let opened: Option<proto::UserPersonal> = open(Some(&sealed)).expect("opens");
        assert_eq!(opened, Some(personal));
    }
}
