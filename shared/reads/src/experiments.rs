//! A broadcast run's experiment figures: each variant's test recipients, delivered mail and
//! unique engagement by the metric (a person's, and a machine's apart), read set-wise from the
//! run engine's recipients and the `emails` read model in one statement grouped by variant.
//! The verdict decides on it; `GET /broadcasts/{id}/runs/{runId}` shows it.

use std::collections::BTreeMap;

use deadpool_postgres::GenericClient;
use domain::email::experiments::{Metric, Tally};

/// Each variant's tally of run `run_id`, by variant id (a variant with no test recipient is
/// absent), from `emails` (the `emails` read model's live schema).
pub async fn tallies(
    client: &impl GenericClient,
    emails: &str,
    run_id: &str,
    metric: &Metric,
) -> Result<BTreeMap<String, Tally>, tokio_postgres::Error> {
    // Clicks: the read model's `clicked` is a person's click; `engagement.clicks` counts
    // machines' too. The same for opens.
    let (human, any) = match metric {
        Metric::Opens => ("opened", "opens"),
        Metric::Clicks | Metric::Conversion { .. } => ("clicked", "clicks"),
    };
    let statement = client
        .prepare_cached(&format!(
            "SELECT r.variant, count(*),
                    count(*) FILTER (WHERE e.status IN ('sent', 'complained')),
                    count(*) FILTER (WHERE e.status IN ('sent', 'complained') AND e.{human}),
                    count(*) FILTER (WHERE NOT COALESCE(e.{human}, false)
                                     AND COALESCE((e.doc -> 'engagement' ->> '{any}')::bigint, 0) > 0)
             FROM broadcast_recipients r LEFT JOIN {emails}.emails e ON e.email_id = r.email_id
             WHERE r.run_id = $1 AND r.variant IS NOT NULL
             GROUP BY r.variant"
        ))
        .await?;
    Ok(client
        .query(&statement, &[&run_id])
        .await?
        .into_iter()
        .map(|row| {
            let tally =
                Tally { recipients: row.get(1), delivered: row.get(2), engaged: row.get(3), machine: row.get(4) };
            (row.get(0), tally)
        })
        .collect())
}
