//! What a click or an open writes: its row of `engagement_inbox`, taken in together with the
//! hits of concurrent requests (one statement and one commit for all of them).

use deadpool_postgres::Pool;
use platform::batch::{BatchError, Batcher};

/// A click or an open as the tracking endpoint takes it in.
pub struct Hit {
    pub email_id: String,
    /// `open` or `click`.
    pub kind: &'static str,
    /// A click's target, sealed (`mail::inbox::seal_inbox_link`).
    pub link: Option<Vec<u8>>,
    pub link_id: String,
    /// A click's link position (from 1); 0 for an open or a link sent without one.
    pub link_position: i32,
    /// What the request alone gave away (`head`, `no_user_agent`, `privacy_proxy`,
    /// `known_bot`), empty for what looked like a person.
    pub signal: &'static str,
    pub at_ms: i64,
}

/// Hits in one statement at most.
const HITS_PER_STATEMENT: usize = 512;

/// The take-in: each hit waits for the statement that inserts it (with the hits that arrived
/// while the one before ran) and is answered once that has committed, so a hit answered is a
/// hit stored, and a statement that fails stores none of its hits and fails them all.
#[derive(Clone)]
pub struct Inbox {
    batcher: Batcher<Hit, ()>,
}

impl Inbox {
    pub fn start(pool: Pool) -> Self {
        let batcher = Batcher::start(HITS_PER_STATEMENT, move |hits: Vec<Hit>| {
            let pool = pool.clone();
            async move { take_in(&pool, &hits).await }
        });
        Self { batcher }
    }

    /// Takes `hit` in; returns once it is committed.
    pub async fn take_in(&self, hit: Hit) -> Result<(), BatchError> {
        self.batcher.call(hit).await
    }
}

/// Inserts `hits` in one statement (committed on return): one answer per hit.
async fn take_in(pool: &Pool, hits: &[Hit]) -> anyhow::Result<Vec<()>> {
    let client = pool.get().await?;
    let statement = client
        .prepare_cached(
            "INSERT INTO engagement_inbox (email_id, kind, link, link_id, link_position, signal, at_ms)
             SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::int[], $6::text[],
                                  $7::bigint[])",
        )
        .await?;
    let email_ids: Vec<&str> = hits.iter().map(|hit| hit.email_id.as_str()).collect();
    let kinds: Vec<&str> = hits.iter().map(|hit| hit.kind).collect();
    let links: Vec<Option<&[u8]>> = hits.iter().map(|hit| hit.link.as_deref()).collect();
    let link_ids: Vec<&str> = hits.iter().map(|hit| hit.link_id.as_str()).collect();
    let positions: Vec<i32> = hits.iter().map(|hit| hit.link_position).collect();
    let signals: Vec<&str> = hits.iter().map(|hit| hit.signal).collect();
    let at: Vec<i64> = hits.iter().map(|hit| hit.at_ms).collect();
    client.execute(&statement, &[&email_ids, &kinds, &links, &link_ids, &positions, &signals, &at]).await?;
    Ok(vec![(); hits.len()])
}
