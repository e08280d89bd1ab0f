//! What a replay's decisions read: the facts the engine's shell loads, from bounded caches and
//! the replay's own runs.

use std::collections::{HashMap, HashSet};

use deadpool_postgres::GenericClient;
use mail::send::Authored;

use super::super::run::contacts_facts;
use super::{CACHED_MAX, Request};
use journeys::decide::{ContactFacts, Engaged, Facts, Need, Row};

/// What decisions read, loaded once and kept.
pub(super) struct Store {
    pub(super) contacts: HashMap<String, ContactFacts>,
    /// Each contact's recorded marketing sends (email, send), since the first decision that
    /// asked.
    recorded_sent: HashMap<String, Vec<(String, mail::send::Sent)>>,
    /// Templates, suppressions and the secret, shared by every decision; the rest is set per
    /// decision.
    pub(super) facts: Facts,
    catalog: Option<String>,
}

impl Store {
    pub(super) fn new() -> Self {
        Store { contacts: HashMap::new(), recorded_sent: HashMap::new(), facts: Facts::default(), catalog: None }
    }

    pub(super) async fn load_contacts(
        &mut self,
        client: &impl GenericClient,
        contact_ids: &[String],
    ) -> anyhow::Result<()> {
        if contact_ids.is_empty() {
            return Ok(());
        }
        if self.contacts.len() + contact_ids.len() > CACHED_MAX {
            self.contacts.clear();
            self.recorded_sent.clear();
        }
        let mut found = contacts_facts(client, contact_ids).await?;
        for contact_id in contact_ids {
            let facts = found.remove(contact_id).unwrap_or(ContactFacts::Gone);
            self.contacts.insert(contact_id.clone(), facts);
        }
        Ok(())
    }

    /// Loads the fact a decision asked for (what the engine's shell loads, from the replay's
    /// caches and its own runs).
    pub(super) async fn load(
        &mut self,
        client: &impl GenericClient,
        (request, row, now): (&Request<'_>, &Row, i64),
        need: Need,
        (emails, sim_sent): (&HashMap<String, Engaged>, &[(String, mail::send::Sent)]),
    ) -> anyhow::Result<()> {
        match need {
            Need::Contact => {
                let Some(contact_id) = &row.contact_id else {
                    self.facts.contact = Some(ContactFacts::None);
                    return Ok(());
                };
                if !self.contacts.contains_key(contact_id) {
                    self.load_contacts(client, std::slice::from_ref(contact_id)).await?;
                }
                self.facts.contact = self.contacts.get(contact_id).cloned();
            }
            Need::Template(template_id) => {
                let catalog = match &self.catalog {
                    Some(catalog) => catalog.clone(),
                    None => {
                        let catalog = platform::readmodel::live_schema(client, "catalog")
                            .await?
                            .ok_or_else(|| anyhow::anyhow!("the catalog has no live version yet"))?;
                        self.catalog = Some(catalog.clone());
                        catalog
                    }
                };
                let authored = Authored::load(client, &catalog, request.space_id, &template_id).await?;
                self.facts.templates.insert(template_id, authored);
            }
            Need::Suppression(address) => {
                if self.facts.suppressed.len() >= CACHED_MAX {
                    self.facts.suppressed.clear();
                }
                let suppressed =
                    mail::facts::suppressed(client, request.space_id, &[&address]).await?.contains(&address);
                self.facts.suppressed.insert(address, suppressed);
            }
            Need::Engagement(email_ids) => {
                for email_id in email_ids {
                    let engaged = emails.get(&email_id).copied().unwrap_or_default();
                    self.facts.engagement.insert(email_id, engaged);
                }
            }
            // A skipped send's story is not told: no fact is read for it.
            Need::DecidedBy { gate, .. } => {
                self.facts.decided_by.insert(gate.as_str(), None);
            }
            Need::MarketingSends { since_ms } => {
                let contact_id = row.contact_id.clone().unwrap_or_default();
                if !self.recorded_sent.contains_key(&contact_id) {
                    let rows = client
                        .query(
                            "SELECT email_id, at_ms, topic_id FROM marketing_sends WHERE contact_id = $1 AND at_ms > $2",
                            &[&contact_id, &since_ms],
                        )
                        .await?;
                    let recorded = rows
                        .into_iter()
                        .map(|row| {
                            let topic_id: String = row.get(2);
                            let sent = mail::send::Sent {
                                at_ms: row.get(1),
                                topic_id: (!topic_id.is_empty()).then_some(topic_id),
                                position: 0,
                                seq: 0,
                            };
                            (row.get::<_, String>(0), sent)
                        })
                        .collect();
                    self.recorded_sent.insert(contact_id.clone(), recorded);
                }
                let recorded = self.recorded_sent.get(&contact_id).map(Vec::as_slice).unwrap_or_default();
                // Each email once: a replayed run of a live journey schedules the live run's
                // email again.
                let mut seen = HashSet::new();
                let sent = recorded
                    .iter()
                    .chain(sim_sent)
                    .filter(|(email_id, sent)| sent.at_ms > since_ms && sent.at_ms <= now && seen.insert(email_id))
                    .map(|(_, sent)| sent.clone())
                    .collect();
                self.facts.sent = Some(sent);
            }
            Need::Secret => self.facts.secret = Some(None),
        }
        Ok(())
    }
}
