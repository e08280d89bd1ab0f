//! Reads of the `broadcasts` read model, and of the broadcast engine's runs and recipients.

use deadpool_postgres::Client;
use domain::email::experiments::ExperimentDef;
use platform::error::ApiError;
use platform::events::LogEvent;
use serde_json::{Value, json};
use tokio_postgres::types::ToSql;

use crate::consistency::page_of_docs;

/// A run as the API shows it, with its counts, from `r` (a `broadcast_runs` row) and `c` (its
/// `email_counts` row of the `emails` read model, joined by [`run_from`]). Nothing is counted
/// here: the run engine counts skips as it decides them, the read model counts emails as their
/// events come.
const RUN: &str = "jsonb_build_object(
    'id', r.run_id, 'broadcastId', r.broadcast_id, 'status', r.status, 'templateId', r.template_id,
    'senderId', r.sender_id, 'audience', r.audience,
    'startAt', to_char(r.start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'requestedAt', to_char(r.requested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'startedAt', to_char(r.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'finishedAt', to_char(r.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'error', r.error,
    'counts', jsonb_build_object(
        'audience', r.audience_count,
        'pending', GREATEST(COALESCE(r.audience_count, 0) - r.skipped_no_consent - r.skipped_not_subscribed
            - r.skipped_suppressed
            - r.skipped_allowance - r.skipped_no_address - r.skipped_gone - r.skipped_frequency_cap
            - r.skipped_quiet_hours - r.skipped_experiment_stopped - COALESCE(c.scheduled, 0), 0),
        'queued', GREATEST(COALESCE(c.scheduled - c.sent - c.failed - c.outcome_unknown - c.held, 0), 0),
        'held', COALESCE(c.held, 0),
        'sent', COALESCE(c.sent, 0),
        'failed', COALESCE(c.failed, 0),
        'outcomeUnknown', COALESCE(c.outcome_unknown, 0),
        'bounced', COALESCE(c.bounced, 0),
        'complained', COALESCE(c.complained, 0),
        'unsubscribed', COALESCE(c.unsubscribed, 0),
        'opened', COALESCE(c.opened, 0),
        'clicked', COALESCE(c.clicked, 0),
        'openRate', CASE WHEN c.sent > c.bounced THEN round(c.opened::numeric / (c.sent - c.bounced), 4) END,
        'clickRate', CASE WHEN c.sent > c.bounced THEN round(c.clicked::numeric / (c.sent - c.bounced), 4) END,
        'skipped', jsonb_build_object(
            'noConsent', r.skipped_no_consent,
            'notSubscribed', r.skipped_not_subscribed,
            'suppressed', r.skipped_suppressed,
            'allowance', r.skipped_allowance,
            'noAddress', r.skipped_no_address,
            'gone', r.skipped_gone,
            'frequencyCap', r.skipped_frequency_cap,
            'quietHours', r.skipped_quiet_hours,
            'experimentStopped', r.skipped_experiment_stopped)),
    'experiment', CASE WHEN r.experiment IS NOT NULL THEN jsonb_build_object(
        'phase', r.phase,
        'definition', r.experiment,
        'decideAt', to_char(r.decide_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
        'winner', r.winner,
        'verdict', r.verdict) END)";

/// The rows [`RUN`] reads: `broadcast_runs r` and its counts in `{m}.email_counts c`.
fn run_from(m: &str) -> String {
    format!(
        "broadcast_runs r LEFT JOIN {m}.email_counts c ON c.bucket_kind = 'broadcast_run' AND c.bucket_id = r.run_id"
    )
}

/// A page of the space's broadcasts, by slug, with the total.
pub async fn page(
    client: &Client,
    b: &str,
    space_id: &str,
    (limit, offset): (i64, i64),
) -> Result<(i64, Vec<Value>), ApiError> {
    let count_sql = format!("SELECT total FROM {b}.broadcast_counts WHERE space_id = $1");
    let rows_sql =
        format!("SELECT doc FROM {b}.broadcasts WHERE space_id = $1 ORDER BY slug, broadcast_id LIMIT $2 OFFSET $3");
    let params: [&(dyn ToSql + Sync); 1] = [&space_id];
    page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
}

/// One broadcast of the space, named by its id or its slug (an id wins), with its id.
pub async fn broadcast(
    client: &Client,
    b: &str,
    space_id: &str,
    id_or_slug: &str,
) -> Result<Option<(String, Value)>, ApiError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT broadcast_id, doc FROM {b}.broadcasts WHERE space_id = $1 AND (broadcast_id = $2 OR slug = $2)
             ORDER BY broadcast_id = $2 DESC LIMIT 1"
        ))
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &id_or_slug]).await?.map(|row| (row.get(0), row.get(1))))
}

/// A page of the broadcast's runs, newest first (by request time, then id), with the total;
/// `None` when the space has no such broadcast.
pub async fn runs(
    client: &Client,
    (b, m): (&str, &str),
    space_id: &str,
    id_or_slug: &str,
    (limit, offset): (i64, i64),
) -> Result<Option<(i64, Vec<Value>)>, ApiError> {
    let Some((broadcast_id, _)) = broadcast(client, b, space_id, id_or_slug).await? else { return Ok(None) };
    let count_sql = "SELECT count(*) FROM broadcast_runs WHERE broadcast_id = $1";
    let rows_sql = format!(
        "SELECT {RUN} FROM {} WHERE r.broadcast_id = $1
         ORDER BY r.requested_at DESC, r.run_id DESC LIMIT $2 OFFSET $3",
        run_from(m)
    );
    let params: [&(dyn ToSql + Sync); 1] = [&broadcast_id];
    page_of_docs(client, count_sql, &rows_sql, &params, (limit, offset)).await.map(Some)
}

/// What a read shows of a run.
#[derive(Debug, Clone, Copy)]
pub enum OfRun {
    /// The run with its counts (and its experiment's figures).
    Run,
    /// Its links' clicks.
    Links,
}

/// What `read` shows of a run of the broadcast; `None` when the space has no such broadcast,
/// `Some(None)` when the broadcast has no such run.
/// `schemas`: the live schemas of the `broadcasts`, `emails` and `events` read models.
pub async fn of_run(
    client: &Client,
    (b, m, v): (&str, &str, &str),
    space_id: &str,
    ids: (&str, &str),
    read: OfRun,
) -> Result<Option<Option<Value>>, ApiError> {
    match read {
        OfRun::Run => run(client, (b, m, v), space_id, ids).await,
        OfRun::Links => Ok(links(client, (b, m), space_id, ids).await?.map(|found| found.map(Value::Array))),
    }
}

/// A run of the broadcast; `None` when the space has no such broadcast, `Some(None)` when the
/// broadcast has no such run.
pub async fn run(
    client: &Client,
    (b, m, v): (&str, &str, &str),
    space_id: &str,
    (id_or_slug, run_id): (&str, &str),
) -> Result<Option<Option<Value>>, ApiError> {
    let Some((broadcast_id, _)) = broadcast(client, b, space_id, id_or_slug).await? else { return Ok(None) };
    let statement = client
        .prepare_cached(&format!("SELECT {RUN} FROM {} WHERE r.broadcast_id = $1 AND r.run_id = $2", run_from(m)))
        .await?;
    let Some(mut document) =
        client.query_opt(&statement, &[&broadcast_id, &run_id]).await?.map(|row| row.get::<_, Value>(0))
    else {
        return Ok(Some(None));
    };
    experiment_results(client, (m, v), run_id, &mut document).await?;
    Ok(Some(Some(document)))
}

/// Adds each variant's figures so far to the experiment of run `document` (one statement for
/// all variants): the test's recipients, delivered mail and engagement by the metric, with
/// machines' engagement apart.
async fn experiment_results(
    client: &Client,
    schemas: (&str, &str),
    run_id: &str,
    document: &mut Value,
) -> Result<(), ApiError> {
    let Some(experiment) = document.get_mut("experiment").filter(|experiment| experiment.is_object()) else {
        return Ok(());
    };
    let Ok(definition) = serde_json::from_value::<ExperimentDef>(experiment["definition"].clone()) else {
        return Ok(());
    };
    let tallies = reads::experiments::tallies(client, schemas, run_id, &definition.metric).await?;
    let results: Vec<Value> = definition
        .variants
        .iter()
        .map(|variant| {
            let tally = tallies.get(&variant.id).copied().unwrap_or_default();
            json!({
                "variant": variant.id,
                "recipients": tally.recipients,
                "delivered": tally.delivered,
                "engaged": tally.engaged,
                "machine": tally.machine,
            })
        })
        .collect();
    experiment["results"] = Value::Array(results);
    Ok(())
}

/// The clicks of each link of a run, by variant then position: every click and each link's
/// unique clickers, a person's and a machine's apart, as the `emails` read model counts them
/// (`link_counts`). `None` when the space has no such broadcast, `Some(None)` when the broadcast
/// has no such run.
pub async fn links(
    client: &Client,
    (b, m): (&str, &str),
    space_id: &str,
    (id_or_slug, run_id): (&str, &str),
) -> Result<Option<Option<Vec<Value>>>, ApiError> {
    let Some((broadcast_id, _)) = broadcast(client, b, space_id, id_or_slug).await? else { return Ok(None) };
    let statement = client
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM broadcast_runs WHERE broadcast_id = $1 AND run_id = $2)")
        .await?;
    if !client.query_one(&statement, &[&broadcast_id, &run_id]).await?.get::<_, bool>(0) {
        return Ok(Some(None));
    }
    let statement = client
        .prepare_cached(&format!(
            "SELECT variant, cohort, position, clicks, clickers, machine_clicks, machine_clickers
             FROM {m}.link_counts
             WHERE bucket_kind = 'broadcast_run' AND bucket_id = $1
             ORDER BY cohort = 'winner', variant, position"
        ))
        .await?;
    let mut links = Vec::new();
    for row in client.query(&statement, &[&run_id]).await? {
        let (variant, cohort, position): (String, String, i32) = (row.get(0), row.get(1), row.get(2));
        let url = link_target(client, m, run_id, &variant, position).await?;
        let some = |text: String| Some(text).filter(|text| !text.is_empty());
        links.push(json!({
            "variant": some(variant),
            "cohort": some(cohort),
            "position": position,
            "url": url,
            "clicks": row.get::<_, i64>(3),
            "uniqueClicks": row.get::<_, i64>(4),
            "machine": {"clicks": row.get::<_, i64>(5), "uniqueClicks": row.get::<_, i64>(6)},
        }));
    }
    Ok(Some(Some(links)))
}

/// What names a link: the target of the link at `position` as one clicker's email of the run
/// (and variant) had it, opened from the log with that contact's key, without its query and
/// fragment (where a target carries what differs per recipient). Nothing is kept in the
/// clear: the counts hold no target. `None` once every clicker's contact is erased.
async fn link_target(
    client: &Client,
    m: &str,
    run_id: &str,
    variant: &str,
    position: i32,
) -> Result<Option<String>, ApiError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT email_id, contact_id FROM {m}.emails
             WHERE broadcast_run_id = $1 AND COALESCE(doc -> 'origin' ->> 'variant', '') = $2
               AND doc -> 'timeline' @> $3
             LIMIT 1"
        ))
        .await?;
    let clicked = json!([{"type": "clicked", "link": position}]);
    let Some(row) = client.query_opt(&statement, &[&run_id, &variant, &clicked]).await? else { return Ok(None) };
    let (email_id, contact_id): (String, String) = (row.get(0), row.get(1));
    let keys = platform::crypto::load_keys(client, &[contact_id]).await?;
    for stored in platform::log::read_streams(client, &[domain::email::stream_id(&email_id)]).await? {
        let event = stored.decode().map_err(|error| ApiError::internal(&error))?;
        if let LogEvent::EmailClicked(clicked) = event
            && i64::from(clicked.link_position) == i64::from(position)
            && let Some(link) = platform::events::open::<platform::proto::ClickedLink>(clicked.link.as_ref(), &keys)?
        {
            return Ok(Some(without_query(&link.url)));
        }
    }
    Ok(None)
}

/// `target` without its query and fragment.
fn without_query(target: &str) -> String {
    target.split(['?', '#']).next().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_named_without_what_differs_per_recipient() {
        assert_eq!(without_query("https://shop.example/sale?uid=42&utm=x#top"), "https://shop.example/sale");
        assert_eq!(without_query("https://shop.example/sale#top"), "https://shop.example/sale");
        assert_eq!(without_query("https://shop.example/"), "https://shop.example/");
    }
}
