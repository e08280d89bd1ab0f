//! The pages a recipient sees, opened as a person opens them: headless Chromium (Debian's,
//! driven over the DevTools protocol by tests/pages/browser.py) against a single node started
//! as a real process (one origin, as in production behind nginx). The unsubscribe link shows
//! the preference page; pressing its buttons unsubscribes, leaves everything and subscribes
//! again, each a page that says so and a change the API sees; a wrong confirmation link and a
//! bad form post are pages too; no screenshot is blank.

use serde_json::{Value, json};

use crate::browser::{browse, text};
use crate::email::{MAIL_KEY, QUICK_FORM, mail_workspace};
use crate::helpers::*;
use crate::log::wait_until_listening;

struct Node {
    base: String,
    http: reqwest::Client,
    database_url: String,
    _process: ChildGuard,
}

impl Node {
    /// A single node with the mail space, writing mail as `.eml` files.
    async fn start() -> Self {
        let database_url = create_database().await;
        let port = free_port();
        let folder = scratch_dir("pages-node");
        let workspace = folder.join("workspace.json");
        std::fs::write(&workspace, mail_workspace(100)).expect("the workspace");
        let base = format!("http://127.0.0.1:{port}/v1");
        let process = spawn_binary(
            "platform",
            &["--workspace", workspace.to_str().expect("a path")],
            &database_url,
            &[
                ("APP__HTTP__PORT", port.to_string()),
                ("APP__EMAIL__EML_DIR", folder.join("outbox").display().to_string()),
                ("APP__EMAIL__PUBLIC_BASE_URL", base.clone()),
            ],
        );
        let http = reqwest::Client::new();
        wait_until_listening(&http, &base).await;
        Self { base, http, database_url, _process: process }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: &Value) -> Value {
        let response = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(MAIL_KEY)
            .json(body)
            .send()
            .await
            .expect("sent");
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {body}");
        body
    }

    async fn query(&self, sql: &str) -> Value {
        let (client, connection) =
            tokio_postgres::connect(&self.database_url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        client.query_one(sql, &[]).await.expect("query").get(0)
    }
}

#[tokio::test]
async fn a_recipient_unsubscribes_changes_preferences_and_sees_pages_for_bad_links_in_a_browser() {
    let node = Node::start().await;
    // A subscriber of the news topic (the quick form subscribes and grants consent) gets the
    // newsletter.
    let submitted = node
        .http
        .post(format!("{}/forms/{QUICK_FORM}/submit", node.base))
        .json(&json!({"email": "pia@example.com", "firstName": "Pia"}))
        .send()
        .await
        .expect("sent");
    assert_eq!(submitted.status(), 200);
    let templates = node.call(reqwest::Method::GET, "/templates", &Value::Null).await;
    let newsletter = templates["data"]
        .as_array()
        .expect("templates")
        .iter()
        .find(|template| template["slug"] == "newsletter")
        .and_then(|template| template["id"].as_str())
        .expect("the newsletter template")
        .to_owned();
    let body = json!({"data": {"contact": {"email": "pia@example.com"}}});
    let sent = node.call(reqwest::Method::POST, &format!("/templates/{newsletter}/send"), &body).await;
    let email_id = sent["data"]["emailId"].as_str().expect("emailId").to_owned();
    let people = node.call(reqwest::Method::GET, "/schemas/people/records", &Value::Null).await;
    let contact_id = people["data"][0]["id"].as_str().expect("the contact").to_owned();
    let topics = node.call(reqwest::Method::GET, "/topics", &Value::Null).await;
    let topic_id = topics["data"][0]["id"].as_str().expect("the news topic").to_owned();
    let page = format!("{}/emails/{email_id}/unsubscribe", node.base);

    // The link opens the preference page; its first button leaves the email's topic.
    let captures = browse(json!([
        {"goto": page}, {"capture": "preferences"},
        {"click": "form button"}, {"capture": "unsubscribed"},
    ]))
    .await;
    let preferences = text(&captures[0]);
    assert_eq!(captures[0]["title"], "Email preferences");
    assert!(preferences.contains("Unsubscribe from News"), "{preferences}");
    // It names the sender and the address it is for, masked.
    assert!(
        preferences.contains("Email from \u{2068}Example Team\u{2069} to \u{2068}p***@example.com\u{2069}."),
        "{preferences}"
    );
    assert!(!preferences.contains("pia@example.com"), "{preferences}");
    assert!(
        preferences.contains("Your subscriptions") && preferences.contains("Unsubscribe from all"),
        "{preferences}"
    );
    let unsubscribed = text(&captures[1]);
    assert!(unsubscribed.contains("You are unsubscribed"), "{unsubscribed}");
    assert!(unsubscribed.contains("You will no longer receive emails about News."), "{unsubscribed}");
    assert!(
        unsubscribed.contains("Email from \u{2068}Example Team\u{2069} to \u{2068}p***@example.com\u{2069}."),
        "{unsubscribed}"
    );
    let status = subscription(&node, &contact_id, &topic_id).await;
    assert_eq!(status, "unsubscribed", "the press left the topic");

    // Back on the page: choosing the topic again and saving subscribes; leaving everything
    // unsubscribes and withdraws the consent.
    let captures = browse(json!([
        {"goto": page}, {"capture": "left-topic"},
        {"click": format!("input[name='{topic_id}'][value='subscribed']")},
        {"click": "form[action='preferences'] button[type='submit']"}, {"capture": "saved"},
        {"goto": page}, {"capture": "again"},
        {"click": "button.secondary"}, {"capture": "left"},
    ]))
    .await;
    assert!(text(&captures[0]).contains("You are not subscribed to News."), "{}", text(&captures[0]));
    assert!(text(&captures[1]).contains("You are subscribed to: News."), "{}", text(&captures[1]));
    assert!(text(&captures[2]).contains("Email preferences"), "{}", text(&captures[2]));
    assert!(!text(&captures[2]).contains("You are not subscribed"), "{}", text(&captures[2]));
    assert!(text(&captures[3]).contains("You are unsubscribed from everything"), "{}", text(&captures[3]));
    assert_eq!(subscription(&node, &contact_id, &topic_id).await, "unsubscribed");
    let sources = node
        .query(&format!(
            "SELECT to_jsonb(count(*)) FROM events WHERE stream_id = 'subscriptions-{contact_id}'
             AND position(convert_to('preferences', 'UTF8') in payload) > 0"
        ))
        .await;
    assert_eq!(sources, 2, "the page's subscribe and its leave-all are logged as preference changes");
    let refused = node
        .http
        .post(format!("{}/templates/{newsletter}/send", node.base))
        .bearer_auth(MAIL_KEY)
        .json(&body)
        .send()
        .await
        .expect("sent");
    let refused_status = refused.status().as_u16();
    let refused: Value = refused.json().await.expect("JSON");
    assert_eq!((refused_status, &refused["error"]["code"]), (422, &json!("recipient_not_subscribed")));

    // A wrong confirmation link, an unknown email, and a form posted without its email, as a
    // browser opens them: pages with the error's status, naming what is wrong.
    let bad_form = scratch_dir("bad-form").join("form.html");
    std::fs::write(
        &bad_form,
        format!(
            "<!doctype html><html><body><form method=\"post\" action=\"{}/forms/{QUICK_FORM}/submit\">\
             <input name=\"email\" value=\"\"><input name=\"firstName\" value=\"Pia\">\
             <button type=\"submit\">Join</button></form></body></html>",
            node.base
        ),
    )
    .expect("the form page");
    let captures = browse(json!([
        {"goto": format!("{}/forms/{QUICK_FORM}/confirm/not-a-token", node.base)}, {"capture": "wrong-link"},
        {"goto": format!("{}/emails/em_unknown/unsubscribe", node.base)}, {"capture": "unknown-email"},
        {"goto": format!("file://{}", bad_form.display())}, {"click": "form button"}, {"capture": "bad-post"},
        {"goto": format!("{}/forms/{QUICK_FORM}/confirm/", node.base)}, {"capture": "cut-confirm"},
        {"goto": format!("{}/emails/{email_id}/unsub", node.base)}, {"capture": "cut-unsubscribe"},
        {"goto": format!("{}/forms/{QUICK_FORM}/submit", node.base)}, {"capture": "submit-opened"},
        {"goto": format!("{}/emails/em_%00/unsubscribe", node.base)}, {"capture": "malformed"},
    ]))
    .await;
    assert_eq!(captures[0]["title"], "Link not valid", "{}", text(&captures[0]));
    assert_eq!(captures[1]["title"], "Link not found", "{}", text(&captures[1]));
    assert_eq!(captures[2]["title"], "Please check what you sent", "{}", text(&captures[2]));
    assert!(text(&captures[2]).contains("email: An email address is required."), "{}", text(&captures[2]));
    // Cut and malformed addresses under /forms/ and /emails/ are pages too, not JSON.
    assert_eq!(captures[3]["title"], "Page not found", "{}", text(&captures[3]));
    assert!(text(&captures[3]).contains("cut off by your mail program"), "{}", text(&captures[3]));
    assert_eq!(captures[4]["title"], "Page not found", "{}", text(&captures[4]));
    assert_eq!(captures[5]["title"], "Page not available", "{}", text(&captures[5]));
    assert_eq!(captures[6]["title"], "Please check what you sent", "{}", text(&captures[6]));
    for capture in &captures[3..] {
        assert!(!text(capture).contains("\"error\""), "a page, not JSON: {}", text(capture));
    }
}

/// The contact's latest subscription status to the topic, from its subscriptions stream.
async fn subscription(node: &Node, contact_id: &str, topic_id: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let events = node
            .query(&format!("SELECT to_jsonb(count(*)) FROM events WHERE stream_id = 'subscriptions-{contact_id}'"))
            .await;
        if events.as_i64().unwrap_or(0) > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no subscriptions");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let pool = platform::db::pool(&node.database_url, 1).expect("a pool");
    let client = pool.get().await.expect("a client");
    let subscriptions = reads::email::subscriptions(&client, contact_id).await.expect("subscriptions");
    subscriptions.get(topic_id).cloned().unwrap_or_default()
}
