//! A broadcast run's experiment figures: each variant's test recipients, delivered mail and
//! unique engagement by the metric (a person's, and a machine's apart; or a conversion), read
//! set-wise from the run engine's recipients and the `emails` (and `events`) read models in one
//! statement grouped by variant.
//! The verdict decides on it; `GET /broadcasts/{id}/runs/{runId}` shows it.

use std::collections::BTreeMap;

use deadpool_postgres::GenericClient;
use domain::email::experiments::{Metric, Tally};

/// Each variant's tally of run `run_id`, by variant id (a variant with no test recipient is
/// absent), from `emails` and `events` (the `emails` and `events` read models' live schemas).
/// A conversion is an event of the metric's schema, ready, about the recipient, that occurred
/// within the window after its email was sent (found by the events' contact index, in the same
/// statement); machines do not convert.
pub async fn tallies(
    client: &impl GenericClient,
    (emails, events): (&str, &str),
    run_id: &str,
    metric: &Metric,
) -> Result<BTreeMap<String, Tally>, tokio_postgres::Error> {
    // Clicks: the read model's `clicked` is a person's click; `engagement.clicks` counts
    // machines' too. The same for opens.
    let (engaged, machine) = match metric {
        Metric::Opens => engagement("opened", "opens"),
        Metric::Clicks => engagement("clicked", "clicks"),
        Metric::Conversion { .. } => (
            format!(
                "EXISTS (SELECT 1 FROM {events}.events v
                         WHERE v.contact_id = r.contact_id AND v.schema_id = $2 AND v.state = 'ready'
                           AND v.occurred_at >= (e.doc ->> 'sentAt')::timestamptz
                           AND v.occurred_at <= (e.doc ->> 'sentAt')::timestamptz + $3::float8 * interval '1 millisecond')"
            ),
            "false".to_owned(),
        ),
    };
    let statement = client
        .prepare_cached(&format!(
            "SELECT r.variant, count(*),
                    count(*) FILTER (WHERE e.status IN ('sent', 'complained')),
                    count(*) FILTER (WHERE e.status IN ('sent', 'complained') AND {engaged}),
                    count(*) FILTER (WHERE {machine})
             FROM broadcast_recipients r LEFT JOIN {emails}.emails e ON e.email_id = r.email_id
             WHERE r.run_id = $1 AND r.variant IS NOT NULL
             GROUP BY r.variant"
        ))
        .await?;
    let rows = match metric {
        Metric::Conversion { schema_id, window_ms } => {
            client.query(&statement, &[&run_id, schema_id, &(*window_ms as f64)]).await?
        }
        Metric::Opens | Metric::Clicks => client.query(&statement, &[&run_id]).await?,
    };
    Ok(rows
        .into_iter()
        .map(|row| {
            let tally =
                Tally { recipients: row.get(1), delivered: row.get(2), engaged: row.get(3), machine: row.get(4) };
            (row.get(0), tally)
        })
        .collect())
}

/// The conditions of an open's or a click's tally: a person's (`human`, the read model's
/// flag), and a machine's only (`any`, the story's count of every open or click).
fn engagement(human: &str, any: &str) -> (String, String) {
    (
        format!("e.{human}"),
        format!("NOT COALESCE(e.{human}, false) AND COALESCE((e.doc -> 'engagement' ->> '{any}')::bigint, 0) > 0"),
    )
}
