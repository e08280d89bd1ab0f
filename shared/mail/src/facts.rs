//! What the send decision reads about its recipients beside their records: the one reader
//! of send facts, set-wise (one statement per kind of fact, whatever the number of
//! recipients). Every send reads them here: the template send, the form confirmation, the
//! journey's send step, the broadcast batch and the held sends worker.
//!
//! - which addresses are suppressed, in the space or globally ([`suppressed`]);
//! - the keys of each schema's email consent attributes ([`consent_keys`]; the rule of which
//!   attribute is one is `domain::email::send::is_email_consent`);
//! - the contacts' topic statuses, folded from their subscriptions streams;
//! - their marketing sends within the send policy's caps' windows ([`marketing_sends`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use deadpool_postgres::GenericClient;
use domain::email::send::Sent;
use serde_json::Value;

/// What a send asks about its recipients.
#[derive(Debug, Default, Clone, Copy)]
pub struct Asked<'a> {
    pub space_id: &'a str,
    /// The contacts whose topic statuses and sends are read.
    pub contact_ids: &'a [String],
    /// The addresses whose suppression is read.
    pub addresses: &'a [&'a str],
    /// Whether their topic statuses are read (a template with a topic).
    pub subscriptions: bool,
    /// Since when their marketing sends are read (a send policy with caps).
    pub sends_since_ms: Option<i64>,
}

/// What was read for an [`Asked`].
#[derive(Debug, Default, Clone)]
pub struct SendFacts {
    /// The addresses among those asked that are suppressed.
    pub suppressed: HashSet<String>,
    /// Each contact's topic statuses (a contact that never changed one is absent).
    pub subscriptions: BTreeMap<String, BTreeMap<String, String>>,
    /// Each contact's marketing sends as [`marketing_sends`] reads them.
    pub sent: HashMap<String, Vec<Sent>>,
}

impl SendFacts {
    /// Reads what `asked` asks, one statement per kind.
    pub async fn load(client: &impl GenericClient, asked: Asked<'_>) -> anyhow::Result<Self> {
        let mut facts =
            SendFacts { suppressed: suppressed(client, asked.space_id, asked.addresses).await?, ..Default::default() };
        if asked.contact_ids.is_empty() {
            return Ok(facts);
        }
        if asked.subscriptions {
            facts.subscriptions = reads::email::subscriptions_of(client, asked.contact_ids).await?;
        }
        if let Some(since_ms) = asked.sends_since_ms {
            facts.sent = marketing_sends(client, asked.contact_ids, since_ms).await?;
        }
        Ok(facts)
    }
}

/// The addresses among `addresses` suppressed in space `space_id` or globally (any reason).
pub async fn suppressed(
    client: &impl GenericClient,
    space_id: &str,
    addresses: &[&str],
) -> Result<HashSet<String>, tokio_postgres::Error> {
    if addresses.is_empty() {
        return Ok(HashSet::new());
    }
    let statement = client
        .prepare_cached(
            "SELECT DISTINCT identifier FROM suppression_keys WHERE scope IN ($1, 'global') AND identifier = ANY($2)",
        )
        .await?;
    Ok(client.query(&statement, &[&space_id, &addresses]).await?.into_iter().map(|row| row.get(0)).collect())
}

/// The keys of the email consent attributes of each of `schema_ids`, from catalog version
/// `catalog` (a schema without one is absent).
pub async fn consent_keys(
    client: &impl GenericClient,
    catalog: &str,
    schema_ids: &[&str],
) -> Result<HashMap<String, Vec<String>>, tokio_postgres::Error> {
    let mut keys: HashMap<String, Vec<String>> = HashMap::new();
    for row in client
        .query(
            &format!("SELECT schema_id, key, definition FROM {catalog}.attributes WHERE schema_id = ANY($1)"),
            &[&schema_ids],
        )
        .await?
    {
        if domain::email::send::is_email_consent(&row.get::<_, Value>(2)) {
            keys.entry(row.get(0)).or_default().push(row.get(1));
        }
    }
    Ok(keys)
}

/// A contact's marketing sends since `since_ms` as the frequency caps count them, each with
/// the log position of its `EmailScheduled`, and its newest send whenever it was (whose place
/// a send decided from them follows; the caps count only what their windows hold): contact →
/// sends, one statement for all of `contact_ids`.
pub async fn marketing_sends(
    client: &impl GenericClient,
    contact_ids: &[String],
    since_ms: i64,
) -> Result<HashMap<String, Vec<Sent>>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(
            "SELECT m.contact_id, m.at_ms, m.topic_id, COALESCE(e.position, 0), COALESCE(m.seq, 0)
             FROM marketing_sends m
             LEFT JOIN events e ON e.stream_id = 'email-' || m.email_id AND e.stream_version = 1
             WHERE m.contact_id = ANY($1)
               AND (m.at_ms > $2
                    OR m.seq = (SELECT max(n.seq) FROM marketing_sends n WHERE n.contact_id = m.contact_id))",
        )
        .await?;
    let mut sends: HashMap<String, Vec<Sent>> = HashMap::new();
    for row in client.query(&statement, &[&contact_ids, &since_ms]).await? {
        let topic_id: String = row.get(2);
        sends.entry(row.get(0)).or_default().push(Sent {
            at_ms: row.get(1),
            topic_id: (!topic_id.is_empty()).then_some(topic_id),
            position: row.get(3),
            seq: row.get(4),
        });
    }
    Ok(sends)
}
