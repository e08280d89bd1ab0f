//! The query service on a hot standby (`APP__DATABASE__READ_URL`; scripts/test starts one
//! with `pg_basebackup -R`): its reads run on the standby, its rate-limit reservations on the
//! primary, and read-your-writes and `Consistency-Token` hold as they do on the primary: a read
//! waits until the standby's read models have reached the caller's position, and says so when
//! they cannot within the wait.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::*;

async fn standby(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("the standby");
    tokio::spawn(connection);
    client
}

/// How long the query service waits for the standby: long enough that a read begun while replay
/// is paused still sees its write once replay resumes 300 ms later, on a machine busy with the
/// rest of the suite (the standby then replays everything every other test wrote meanwhile).
const CONSISTENCY_WAIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn reads_on_the_standby_see_the_callers_writes_and_wait_for_replay() {
    let options = Options { query_on_replica: true, consistency_wait: Some(CONSISTENCY_WAIT), ..Options::default() };
    let app = TestApp::spawn_with(options).await;
    let replica = app.replica_url.clone().expect("the query service reads from the standby");
    let standby = standby(&replica).await;
    assert!(standby.query_one("SELECT pg_is_in_recovery()", &[]).await.expect("asked").get::<_, bool>(0));
    standby.execute("SELECT pg_wal_replay_resume()", &[]).await.expect("replaying");

    // A read right after a write sees it, every time.
    for index in 0..20 {
        let created = app.create_contact(&json!({"email": format!("standby{index}@example.com")})).await;
        let id = created["id"].as_str().expect("id");
        let read = app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await;
        assert_eq!(read.status, 200, "iteration {index}: {:?}", read.body);
        assert!(read.body.get("warnings").is_none(), "iteration {index}: {:?}", read.body);
        assert_eq!(read.body["data"]["email"], format!("standby{index}@example.com"));
    }
    // The query service's connections are on the standby, its reservations on the primary.
    let sessions: i64 = standby
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("sessions")
        .get(0);
    assert!(sessions > 0, "the query service reads from the standby");
    assert!(app.query_i64("SELECT count(*) FROM rate_windows").await > 0, "rate limits are kept on the primary");

    // Replay paused: the standby cannot reach the caller's next write, so the read waits out
    // its bound and answers what the standby has, with a stale_read warning.
    standby.execute("SELECT pg_wal_replay_pause()", &[]).await.expect("paused");

    // A key created while the standby lags works at once: the standby does not know it, the
    // primary does.
    let applied = app.apply_workspace(&crate::email::mail_workspace(10), false).await;
    command_service::authoring::wait_for_catalog(&app.pool, applied.position, Duration::from_secs(20))
        .await
        .expect("the primary's catalog has the key");
    let me = app.get("/me", crate::email::MAIL_KEY).await;
    assert_eq!(me.status, 200, "a key the standby has not replayed yet: {:?}", me.body);
    assert!(me.body.to_string().contains("mail admin"), "{:?}", me.body);
    assert_eq!(app.get("/me", "sk_test_nobody_000000000000000000000").await.status, 401, "unknown on both");

    let created = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": "paused@example.com"})).await;
    assert_eq!(created.status, 201);
    let token = created.header("consistency-token").expect("token").to_owned();
    let id = created.body["data"]["id"].as_str().expect("id").to_owned();
    let started = Instant::now();
    let stale = app.get("/schemas/contacts/records?limit=100", ALPHA_ADMIN).await;
    assert!(started.elapsed() >= CONSISTENCY_WAIT, "the read waited for the standby");
    assert_eq!(stale.status, 200);
    assert_eq!(stale.body["warnings"][0]["code"], "stale_read", "{:?}", stale.body);
    assert_eq!(stale.body["pagination"]["totalCount"], 20, "the standby does not have the write yet");

    // Another key with the write's token waits for it too; once replay resumes it is read.
    let url = format!("{}/schemas/contacts/records/{id}", app.query_url);
    let reader = tokio::spawn({
        let (client, token) = (app.http.clone(), token.clone());
        async move {
            let response = client
                .get(url)
                .bearer_auth(ALPHA_MEMBER)
                .header("Consistency-Token", token)
                .send()
                .await
                .expect("sent");
            (response.status().as_u16(), response.json::<serde_json::Value>().await.expect("JSON"))
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    standby.execute("SELECT pg_wal_replay_resume()", &[]).await.expect("resumed");
    let (status, body) = reader.await.expect("reader");
    assert_eq!((status, &body["data"]["email"]), (200, &json!("paused@example.com")), "{body}");
    assert!(body.get("warnings").is_none(), "{body}");
    let fresh = app.get("/schemas/contacts/records?limit=100", ALPHA_ADMIN).await;
    assert_eq!(fresh.body["pagination"]["totalCount"], 21, "{:?}", fresh.body);
    let position: i64 = fresh.header("projection-position").expect("position").parse().expect("integer");
    assert!(position >= token.parse::<i64>().expect("integer"));
}

/// The query service's read pool goes to a standby of its URL, and to the primary while no
/// standby answers (after a failover, until a new standby joins): reads never stop for want
/// of a standby. Its URL lists every node with `target_session_attrs=read-only`.
#[tokio::test]
async fn the_read_pool_prefers_a_standby_and_falls_back_to_the_primary() {
    let options = Options { query_on_replica: true, ..Options::default() };
    let app = TestApp::spawn_with(options).await;
    let replica = app.replica_url.clone().expect("a standby");
    let in_recovery = |pool: deadpool_postgres::Pool| async move {
        let client = pool.get().await.expect("a read connection");
        client.query_one("SELECT pg_is_in_recovery()", &[]).await.expect("asked").get::<_, bool>(0)
    };
    let setting = |url: &str, key: &str| {
        url.split_whitespace().find_map(|part| part.strip_prefix(key)).map(str::to_owned).expect("a setting")
    };
    let (primary_port, standby_port) = (setting(&app.database_url, "port="), setting(&replica, "port="));
    let dbname = setting(&app.database_url, "dbname=");
    // The primary first in the list: a read-only session passes it over for the standby.
    let both = format!(
        "host=127.0.0.1,127.0.0.1 port={primary_port},{standby_port} user=postgres dbname={dbname} \
         target_session_attrs=read-only"
    );
    let pool = platform::db::standby_pool(&both, &app.database_url, 2).expect("a pool");
    assert!(in_recovery(pool).await, "a standby answered, so reads go there");

    let nowhere =
        format!("host=127.0.0.1 port={} user=postgres dbname={dbname} target_session_attrs=read-only", free_port());
    let pool = platform::db::standby_pool(&nowhere, &app.database_url, 2).expect("a pool");
    assert!(!in_recovery(pool).await, "no standby answered, so reads go to the primary");
}
