//! The read models. Each knows its tables (created in a schema of its own per version) and
//! how one log event changes them.

mod catalog;
pub mod deletions;
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
}

impl Projection {
    pub const ALL: [Projection; 4] =
        [Projection::Catalog, Projection::Records, Projection::Suppressions, Projection::Deletions];

    pub fn name(self) -> &'static str {
        match self {
            Self::Catalog => shared::catalog::CATALOG,
            Self::Records => "records",
            Self::Suppressions => "suppressions",
            Self::Deletions => "deletions",
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
        match self {
            Self::Catalog => {
                for event in events.iter().filter(|event| catalog::EVENT_TYPES.contains(&event.event_type.as_str())) {
                    catalog::apply(transaction, schema, event).await.with_context(|| {
                        format!("projection catalog failed on {} at position {}", event.event_type, event.position)
                    })?;
                }
                Ok(())
            }
            Self::Suppressions => {
                for event in events.iter().filter(|e| suppressions::EVENT_TYPES.contains(&e.event_type.as_str())) {
                    suppressions::apply(transaction, schema, event).await.with_context(|| {
                        format!("projection suppressions failed on {} at position {}", event.event_type, event.position)
                    })?;
                }
                Ok(())
            }
            Self::Deletions => {
                for event in events.iter().filter(|e| deletions::EVENT_TYPES.contains(&e.event_type.as_str())) {
                    deletions::apply(transaction, schema, event).await.with_context(|| {
                        format!("projection deletions failed on {} at position {}", event.event_type, event.position)
                    })?;
                }
                Ok(())
            }
            Self::Records => records::apply(transaction, schema, events).await.with_context(|| {
                let first = events.first().map_or(0, |event| event.position);
                format!("projection records failed on the batch starting at position {first}")
            }),
        }
    }
}
