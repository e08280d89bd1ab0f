//! The read models. Each knows its tables (created in a schema of its own per version) and
//! how one log event changes them.

mod catalog;
pub mod deletions;
mod events;
mod records;
mod suppressions;

use anyhow::Context;
use deadpool_postgres::Transaction;
use shared::log::StoredEvent;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projection {
    /// Spaces, users, memberships, keys, schemas, attributes, credits, authored resources.
    Catalog,
    /// Contact and object records, with per-schema counters for list totals.
    Records,
    /// The email suppression list, space-scoped and global.
    Suppressions,
    /// Record deletion operations and their status.
    Deletions,
    /// Business events with their readiness, and the cursor index of ready events.
    Events,
}

impl Projection {
    pub const ALL: [Projection; 5] =
        [Projection::Catalog, Projection::Records, Projection::Suppressions, Projection::Deletions, Projection::Events];

    pub fn name(self) -> &'static str {
        match self {
            Self::Catalog => shared::catalog::CATALOG,
            Self::Records => "records",
            Self::Suppressions => "suppressions",
            Self::Deletions => "deletions",
            Self::Events => "events",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|projection| projection.name() == name)
    }

    /// Creates the tables of one version inside `schema`.
    pub fn ddl(self, schema: &str) -> String {
        let tables = match self {
            Self::Catalog => catalog::DDL,
            Self::Records => records::DDL,
            Self::Suppressions => suppressions::DDL,
            Self::Deletions => deletions::DDL,
            Self::Events => events::DDL,
        };
        format!("CREATE SCHEMA {schema};\n{}", tables.replace("{s}", schema))
    }

    /// Applies a batch of events, in order. Runs in the batch transaction that also advances
    /// the checkpoint.
    pub async fn apply(
        self,
        transaction: &Transaction<'_>,
        schema: &str,
        events: &[StoredEvent],
    ) -> anyhow::Result<()> {
        // Set-based: the whole batch in a few statements.
        let set_based = match self {
            Self::Records => Some(records::apply(transaction, schema, events).await),
            Self::Events => Some(events::apply(transaction, schema, events).await),
            _ => None,
        };
        if let Some(applied) = set_based {
            return applied.with_context(|| {
                let first = events.first().map_or(0, |event| event.position);
                format!("projection {} failed on the batch starting at position {first}", self.name())
            });
        }
        // The others apply event by event (the set-based ones returned above and never reach
        // these).
        let types = match self {
            Self::Catalog => catalog::EVENT_TYPES,
            Self::Suppressions => suppressions::EVENT_TYPES,
            Self::Deletions | Self::Records | Self::Events => deletions::EVENT_TYPES,
        };
        for event in events.iter().filter(|event| types.contains(&event.event_type.as_str())) {
            let applied = match self {
                Self::Catalog => catalog::apply(transaction, schema, event).await,
                Self::Suppressions => suppressions::apply(transaction, schema, event).await,
                Self::Deletions | Self::Records | Self::Events => deletions::apply(transaction, schema, event).await,
            };
            applied.with_context(|| {
                format!("projection {} failed on {} at position {}", self.name(), event.event_type, event.position)
            })?;
        }
        Ok(())
    }
}
