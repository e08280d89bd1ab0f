//! Typed log events: the name each payload is stored under, and sealing of personal data.

use prost::Message;

use crate::crypto::{DataKey, Keys};
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
    RecordDeletionRequested(proto::RecordDeletionRequested),
    RecordDeletionBlocked(proto::RecordDeletionBlocked),
    RecordDeletionCompleted(proto::RecordDeletionCompleted),
    SuppressionAdded(proto::SuppressionAdded),
    SuppressionRemoved(proto::SuppressionRemoved),
    EventAccepted(proto::EventAccepted),
    EventReadinessChanged(proto::EventReadinessChanged),
    EventIdentityChanged(proto::EventIdentityChanged),
    AiCreditsSpent(proto::AiCreditsSpent),
    WebhookCreated(proto::WebhookCreated),
    WebhookUpdated(proto::WebhookUpdated),
    WebhookPaused(proto::WebhookPaused),
    WebhookSecretRotated(proto::WebhookSecretRotated),
    WebhookDeleted(proto::WebhookDeleted),
    WebhookDeliveryReplayRequested(proto::WebhookDeliveryReplayRequested),
    WebhookTestRequested(proto::WebhookTestRequested),
    EmailScheduled(proto::EmailScheduled),
    EmailSent(proto::EmailSent),
    EmailFailed(proto::EmailFailed),
    EmailOutcomeUnknown(proto::EmailOutcomeUnknown),
    EmailBounced(proto::EmailBounced),
    EmailComplained(proto::EmailComplained),
    EmailUnsubscribed(proto::EmailUnsubscribed),
    EmailOpened(proto::EmailOpened),
    EmailClicked(proto::EmailClicked),
    EmailSkipped(proto::EmailSkipped),
    EmailTestRequested(proto::EmailTestRequested),
    EmailTestSent(proto::EmailTestSent),
    EmailHeld(proto::EmailHeld),
    EmailReleased(proto::EmailReleased),
    SubscriptionChanged(proto::SubscriptionChanged),
    FormSubmitted(proto::FormSubmitted),
    SubmissionConfirmed(proto::SubmissionConfirmed),
    SegmentCreated(proto::SegmentCreated),
    SegmentDeleted(proto::SegmentDeleted),
    SegmentWindowElapsed(proto::SegmentWindowElapsed),
    BroadcastUpdated(proto::BroadcastUpdated),
    BroadcastRunRequested(proto::BroadcastRunRequested),
    BroadcastExperimentDecided(proto::BroadcastExperimentDecided),
    WorkflowPaused(proto::WorkflowPaused),
    WorkflowUnpaused(proto::WorkflowUnpaused),
    IngestMessageKept(proto::IngestMessageKept),
    IngestMessagesRefused(proto::IngestMessagesRefused),
    WorkflowRunRequested(proto::WorkflowRunRequested),
    WorkflowRunStarted(proto::WorkflowRunStarted),
    WorkflowStepStarted(proto::WorkflowStepStarted),
    WorkflowRunSleeping(proto::WorkflowRunSleeping),
    WorkflowStepFinished(proto::WorkflowStepFinished),
    WorkflowRunPaused(proto::WorkflowRunPaused),
    WorkflowRunResumed(proto::WorkflowRunResumed),
    WorkflowRunFinished(proto::WorkflowRunFinished),
    WorkflowRunAdvanced(proto::WorkflowRunAdvanced),
    WorkflowRunMigrated(proto::WorkflowRunMigrated),
    WorkflowReplayRequested(proto::WorkflowReplayRequested),
    WorkflowReplayFinished(proto::WorkflowReplayFinished),
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

            /// The length of [`Self::encode`]'s bytes, without encoding.
            pub fn encoded_len(&self) -> usize {
                match self {
                    $(Self::$variant(message) => message.encoded_len(),)*
                    Self::Unknown(_) => 0,
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

impl LogEvent {
    /// The email an event of an email's stream is about; `None` for any other event.
    pub fn email_id(&self) -> Option<&str> {
        Some(match self {
            Self::EmailScheduled(e) => &e.email_id,
            Self::EmailSent(e) => &e.email_id,
            Self::EmailFailed(e) => &e.email_id,
            Self::EmailOutcomeUnknown(e) => &e.email_id,
            Self::EmailBounced(e) => &e.email_id,
            Self::EmailComplained(e) => &e.email_id,
            Self::EmailUnsubscribed(e) => &e.email_id,
            Self::EmailOpened(e) => &e.email_id,
            Self::EmailClicked(e) => &e.email_id,
            Self::EmailSkipped(e) => &e.email_id,
            Self::EmailHeld(e) => &e.email_id,
            Self::EmailReleased(e) => &e.email_id,
            _ => return None,
        })
    }
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
    RecordDeletionRequested => "RecordDeletionRequested.v1",
    RecordDeletionBlocked => "RecordDeletionBlocked.v1",
    RecordDeletionCompleted => "RecordDeletionCompleted.v1",
    SuppressionAdded => "SuppressionAdded.v1",
    SuppressionRemoved => "SuppressionRemoved.v1",
    EventAccepted => "EventAccepted.v1",
    EventReadinessChanged => "EventReadinessChanged.v1",
    EventIdentityChanged => "EventIdentityChanged.v1",
    AiCreditsSpent => "AiCreditsSpent.v1",
    WebhookCreated => "WebhookCreated.v1",
    WebhookUpdated => "WebhookUpdated.v1",
    WebhookPaused => "WebhookPaused.v1",
    WebhookSecretRotated => "WebhookSecretRotated.v1",
    WebhookDeleted => "WebhookDeleted.v1",
    WebhookDeliveryReplayRequested => "WebhookDeliveryReplayRequested.v1",
    WebhookTestRequested => "WebhookTestRequested.v1",
    EmailScheduled => "EmailScheduled.v1",
    EmailSent => "EmailSent.v1",
    EmailFailed => "EmailFailed.v1",
    EmailOutcomeUnknown => "EmailOutcomeUnknown.v1",
    EmailBounced => "EmailBounced.v1",
    EmailComplained => "EmailComplained.v1",
    EmailUnsubscribed => "EmailUnsubscribed.v1",
    EmailOpened => "EmailOpened.v1",
    EmailClicked => "EmailClicked.v1",
    EmailSkipped => "EmailSkipped.v1",
    EmailHeld => "EmailHeld.v1",
    EmailReleased => "EmailReleased.v1",
    EmailTestRequested => "EmailTestRequested.v1",
    EmailTestSent => "EmailTestSent.v1",
    SubscriptionChanged => "SubscriptionChanged.v1",
    FormSubmitted => "FormSubmitted.v1",
    SubmissionConfirmed => "SubmissionConfirmed.v1",
    SegmentCreated => "SegmentCreated.v1",
    SegmentDeleted => "SegmentDeleted.v1",
    SegmentWindowElapsed => "SegmentWindowElapsed.v1",
    BroadcastUpdated => "BroadcastUpdated.v1",
    BroadcastRunRequested => "BroadcastRunRequested.v1",
    BroadcastExperimentDecided => "BroadcastExperimentDecided.v1",
    WorkflowPaused => "WorkflowPaused.v1",
    WorkflowUnpaused => "WorkflowUnpaused.v1",
    WorkflowRunRequested => "WorkflowRunRequested.v1",
    WorkflowRunStarted => "WorkflowRunStarted.v1",
    WorkflowStepStarted => "WorkflowStepStarted.v1",
    WorkflowRunSleeping => "WorkflowRunSleeping.v1",
    WorkflowStepFinished => "WorkflowStepFinished.v1",
    WorkflowRunPaused => "WorkflowRunPaused.v1",
    WorkflowRunResumed => "WorkflowRunResumed.v1",
    WorkflowRunFinished => "WorkflowRunFinished.v1",
    WorkflowRunAdvanced => "WorkflowRunAdvanced.v1",
    WorkflowRunMigrated => "WorkflowRunMigrated.v1",
    WorkflowReplayRequested => "WorkflowReplayRequested.v1",
    WorkflowReplayFinished => "WorkflowReplayFinished.v1",
    IngestMessageKept => "IngestMessageKept.v1",
    IngestMessagesRefused => "IngestMessagesRefused.v1",
}

/// Wraps a subject's personal data in the clear. Decisions build events with this; the
/// write path then encrypts the seals of erasable subjects with [`encrypt`] before appending.
/// Seals left in the clear are those of subjects with no erasure through the API (users
/// authored in the workspace file, suppression entries; see the `log` module's documentation).
pub fn seal<M: Message>(subject_id: &str, personal: &M) -> proto::Sealed {
    proto::Sealed {
        body: Some(proto::sealed::Body::Clear(personal.encode_to_vec())),
        subject_id: subject_id.to_owned(),
    }
}

/// Encrypts a clear seal under its subject's data key (a no-op for an encrypted one).
pub fn encrypt(sealed: &mut proto::Sealed, key: &DataKey) -> anyhow::Result<()> {
    if let Some(proto::sealed::Body::Clear(bytes)) = &sealed.body {
        let ciphertext = key.encrypt(&sealed.subject_id, bytes)?;
        sealed.body = Some(proto::sealed::Body::Ciphertext(ciphertext));
    }
    Ok(())
}

/// The personal data inside a seal; `None` when it is absent or erased (its subject's data
/// key is gone from `keys`). Erased data reads the same way on every replay.
pub fn open<M: Message + Default>(sealed: Option<&proto::Sealed>, keys: &Keys) -> anyhow::Result<Option<M>> {
    let Some(sealed) = sealed else { return Ok(None) };
    match &sealed.body {
        Some(proto::sealed::Body::Clear(bytes)) => Ok(Some(M::decode(bytes.as_slice())?)),
        Some(proto::sealed::Body::Ciphertext(ciphertext)) => match keys.get(&sealed.subject_id) {
            Some(key) => Ok(Some(M::decode(key.decrypt(&sealed.subject_id, ciphertext)?.as_slice())?)),
            None => Ok(None),
        },
        None => Ok(None),
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
        let opened: Option<proto::UserPersonal> = open(Some(&sealed), &Keys::default()).expect("opens");
        assert_eq!(opened, Some(personal));
    }

    #[test]
    fn encrypted_seals_open_with_the_key_and_read_as_erased_without_it() {
        let keyring = crate::crypto::Keyring::from_hex(crate::crypto::TEST_MASTER_KEY).expect("key");
        let (key, _) = keyring.generate("con_1").expect("generates");
        let personal = proto::UserPersonal { name: "Ada".into(), email: "ada@example.com".into() };
        let mut sealed = seal("con_1", &personal);
        encrypt(&mut sealed, &key).expect("encrypts");
        assert!(matches!(sealed.body, Some(proto::sealed::Body::Ciphertext(_))));
        let mut keys = Keys::default();
        keys.insert("con_1".into(), key);
        let opened: Option<proto::UserPersonal> = open(Some(&sealed), &keys).expect("opens");
        assert_eq!(opened, Some(personal));
        let erased: Option<proto::UserPersonal> = open(Some(&sealed), &Keys::default()).expect("no error");
        assert_eq!(erased, None);
    }
}
