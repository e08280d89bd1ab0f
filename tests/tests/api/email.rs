//! Email: the authored domains, senders, topics and templates read through the API, and
//! template sends over real SMTP to a loopback sink (`tests/email/smtp_sink.py`) that checks
//! each DKIM signature with dkimpy against the domain's published key.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;
use crate::smtp_sink::SmtpSink;

pub(crate) const MAIL_KEY: &str = "sk_test_mail_admin_0000000000000001";
const MAIL_READER: &str = "sk_test_mail_reader_000000000000002";
const WAIT: Duration = Duration::from_secs(20);
pub(crate) const SIGNUP_FORM: &str = "frm_signup000000000000000000000001";
pub(crate) const WEEKLY_BROADCAST: &str = "bc_weekly000000000000000000000001";
pub(crate) const BLAST_BROADCAST: &str = "bc_blast0000000000000000000000002";
pub(crate) const QUICK_FORM: &str = "frm_quick0000000000000000000000002";
const CLOSED_FORM: &str = "frm_closed000000000000000000000003";

/// The fixture workspace plus a space `mail` with a consent attribute, a domain, a sender, a
/// topic, a transactional and a marketing template, and an allowance of `allowance` a month.
/// The mail space's DKIM key (RSA 2048, PKCS#1).
const DKIM_KEY: &str = include_str!("../../fixtures/dkim-k1.pem");

pub(crate) fn mail_workspace(allowance: i64) -> String {
    let mut workspace: Value = serde_json::from_str(WORKSPACE).expect("the fixture is JSON");
    let space = json!({
        "slug": "mail",
        "name": "Mail",
        "emailAllowance": {"monthly": allowance},
        "aiCredits": 100,
        "schemas": [
            {"slug": "people", "name": "People", "type": "contact", "attributes": [
                {"key": "firstName", "definition": {"type": "string"}},
                {"key": "newsConsent", "definition": {"type": "boolean", "consent": {"channel": "email"}}}
            ]},
            {"slug": "orders", "name": "Orders", "type": "object", "attributes": [
                {"key": "total", "definition": {"type": "number"}}
            ]},
            {"slug": "purchase", "name": "Purchase", "type": "event", "attributes": [
                {"key": "amount", "definition": {"type": "number"}}
            ]}
        ],
        // A given key: generating an RSA key costs about two seconds of a core in a test build,
        // and most tests apply this workspace (generation has tests of its own).
        "domains": [{"slug": "main", "name": "mail.example.test", "dkimSelector": "k1",
                     "dkimPrivateKeyPem": DKIM_KEY}],
        "senders": [{"slug": "hello", "fromName": "Example Team", "fromAddress": "hello@mail.example.test",
                     "domain": "main", "replyTo": "support@mail.example.test",
                     "postalAddress": "Example Inc.\n1 Main Street\nSpringfield, IL 62701"}],
        "topics": [{"slug": "news", "name": "News", "description": "Product news"}],
        "templates": [
            {"slug": "receipt", "name": "Receipt", "kind": "transactional", "sender": "hello",
             "subject": "Order {{ order.externalId }} for {{ contact.firstName }}",
             "html": "<p>Hi {{ contact.firstName }}, you paid {{ order.total }}.</p>",
             "text": "Hi {{ contact.firstName }}, you paid {{ order.total }}.",
             "data": {"contact": {"schema": "people"}, "order": {"schema": "orders"}}},
            {"slug": "newsletter", "name": "Newsletter", "kind": "marketing", "sender": "hello", "topic": "news",
             "subject": "News for {{ contact.firstName }}", "html": "<p>News: <a href=\"https://example.com/news\">read on</a></p>", "text": "News",
             "data": {"contact": {"schema": "people"}}},
            {"slug": "promo", "name": "Promo", "kind": "marketing", "sender": "hello",
             "subject": "Promo", "html": "<p>Promo</p>", "text": "Promo",
             "data": {"contact": {"schema": "people"}}},
            {"slug": "broken", "name": "Broken", "kind": "transactional", "sender": "hello",
             // Renders with the sample data `apply` checks it with (every attribute set), not
             // for a contact without a first name.
             "subject": "{% unless contact.firstName %}{{ contact.nickname }}{% endunless %}", "html": "", "text": "",
             "data": {"contact": {"schema": "people"}}},
            {"slug": "confirm", "name": "Confirm", "kind": "transactional", "sender": "hello",
             "subject": "Confirm your subscription to {{ form.name }}",
             "html": "<p>Hi {{ contact.firstName }}, <a href=\"{{ confirmUrl }}\">confirm</a></p>",
             "text": "Hi {{ contact.firstName }}, confirm: {{ confirmUrl }}",
             "data": {"contact": {"schema": "people"}}}
        ],
        "broadcasts": [
            {"slug": "weekly", "id": WEEKLY_BROADCAST, "name": "Weekly news", "template": "newsletter",
             "audience": {"topic": "news"}},
            {"slug": "blast", "id": BLAST_BROADCAST, "name": "Promo blast", "template": "promo",
             "audience": {"segment": "seg_not_made_yet"}, "scheduledAt": "2030-01-01T00:00:00Z"}
        ],
        "forms": [
            {"slug": "signup", "id": SIGNUP_FORM, "name": "Newsletter signup", "schema": "people",
             "fields": {"email_address": "email", "first_name": "firstName"}, "topics": ["news"],
             "doubleOptIn": true, "confirmationTemplate": "confirm"},
            {"slug": "quick", "id": QUICK_FORM, "name": "Quick signup", "schema": "people",
             "fields": ["email", "firstName"], "topics": ["news"], "doubleOptIn": false},
            {"slug": "closed", "id": CLOSED_FORM, "name": "Closed", "schema": "people", "fields": ["email"],
             "doubleOptIn": false, "enabled": false}
        ]
    });
    workspace["spaces"].as_array_mut().expect("spaces").push(space);
    workspace["users"].as_array_mut().expect("users").push(json!({
        "email": "admin@mail.test",
        "name": "Mail Admin",
        "memberships": [{"space": "mail", "role": "admin"}],
        "apiKeys": [{"name": "mail admin", "space": "mail", "secret": MAIL_KEY}]
    }));
    workspace["users"].as_array_mut().expect("users").push(json!({
        "email": "reader@mail.test",
        "name": "Mail Reader",
        "memberships": [{"space": "mail", "role": "non_paid_admin"}],
        "apiKeys": [{"name": "mail reader", "space": "mail", "secret": MAIL_READER}]
    }));
    workspace.to_string()
}

/// An app sending to `sink`, with the mail space applied and its DKIM key published to the
/// sink's resolver.
pub(crate) async fn mail_app(sink: &SmtpSink, allowance: i64) -> TestApp {
    mail_app_with(sink, allowance, test_email(sink)).await
}

/// Email settings for the tests: the sink as the relay, a short grace before the outbox
/// worker takes over an email, and quick polls.
pub(crate) fn test_email(sink: &SmtpSink) -> platform::settings::EmailSettings {
    platform::settings::EmailSettings {
        relay_url: Some(sink.relay_url().into()),
        public_base_url: "https://api.example.test/v1".to_owned(),
        platform_domain: Some("platform.example.test".to_owned()),
        timeout_ms: 3_000,
        handoff_grace_ms: 1_000,
        outbox_poll_ms: 100,
        retry_schedule_ms: vec![200, 400],
        ..Default::default()
    }
}

pub(crate) async fn mail_app_with(
    sink: &SmtpSink,
    allowance: i64,
    email: platform::settings::EmailSettings,
) -> TestApp {
    let app = TestApp::spawn_with(Options { email: Some(email), ..Options::default() }).await;
    app.apply_workspace(&mail_workspace(allowance), true).await;
    publish_dkim(&app, sink).await;
    app
}

/// Publishes the mail domain's DKIM record to the sink's resolver.
pub(crate) async fn publish_dkim(app: &TestApp, sink: &SmtpSink) {
    let domains = app.get("/domains", MAIL_KEY).await;
    assert_eq!(domains.status, 200, "{:?}", domains.body);
    for record in domains.body["data"][0]["records"].as_array().expect("records") {
        if record["purpose"] == "dkim" {
            sink.add_dkim_record(record["name"].as_str().expect("name"), record["value"].as_str().expect("value"))
                .await;
        }
    }
}

pub(crate) async fn template_id(app: &TestApp, slug: &str) -> String {
    let list = app.get("/templates", MAIL_KEY).await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    list.body["data"]
        .as_array()
        .expect("templates")
        .iter()
        .find(|template| template["slug"] == slug)
        .and_then(|template| template["id"].as_str())
        .unwrap_or_else(|| panic!("no template {slug}"))
        .to_owned()
}

pub(crate) async fn send(app: &TestApp, template: &str, body: &Value, idempotency_key: Option<&str>) -> TestResponse {
    let mut request =
        app.request(reqwest::Method::POST, &format!("/templates/{template}/send"), Some(MAIL_KEY)).json(body);
    if let Some(key) = idempotency_key {
        request = request.header("Idempotency-Key", key);
    }
    app.send(request).await
}

pub(crate) fn receipt_body(email: &str, first_name: &str) -> Value {
    json!({"data": {
        "contact": {"email": email, "firstName": first_name},
        "order": {"externalId": "ord-1", "total": 42.5}
    }})
}

#[tokio::test]
async fn domains_senders_topics_and_templates_are_listed_and_read() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let domains = app.get("/domains", MAIL_READER).await;
    assert_eq!(domains.status, 200, "{:?}", domains.body);
    assert_eq!(domains.body["pagination"]["totalCount"], 1, "{:?}", domains.body);
    let domain = &domains.body["data"][0];
    assert_eq!(domain["name"], "mail.example.test");
    assert_eq!(domain["status"], "pending");
    let purposes: Vec<&str> =
        domain["records"].as_array().expect("records").iter().filter_map(|r| r["purpose"].as_str()).collect();
    assert_eq!(purposes, ["spf", "dkim", "dmarc", "returnPath"]);
    assert_eq!(domain["records"][1]["name"], "k1._domainkey.mail.example.test");
    // SPF and the return path point at the installation's mail domain, not at a placeholder.
    assert_eq!(domain["records"][0]["value"], "v=spf1 include:_spf.platform.example.test ~all");
    assert_eq!(
        (&domain["records"][3]["name"], &domain["records"][3]["value"]),
        (&json!("bounces.mail.example.test"), &json!("bounces.platform.example.test"))
    );
    assert!(domain["records"][1]["value"].as_str().is_some_and(|v| v.starts_with("v=DKIM1; k=rsa; p=MII")));
    let text = domains.body.to_string();
    assert!(!text.contains("wrappedKey") && !text.contains("privateKey"), "the key never leaves: {text}");
    let id = domain["id"].as_str().expect("id");
    assert_eq!(app.get(&format!("/domains/{id}"), MAIL_KEY).await.body["data"], *domain);

    let senders = app.get("/senders", MAIL_KEY).await;
    assert_eq!(senders.body["data"][0]["fromAddress"], "hello@mail.example.test");
    assert_eq!(senders.body["data"][0]["domainId"], *id);
    let topics = app.get("/topics", MAIL_KEY).await;
    assert_eq!(topics.body["data"][0]["name"], "News");
    let templates = app.get("/templates?limit=2", MAIL_KEY).await;
    assert_eq!(templates.body["pagination"]["totalCount"], 5);
    assert_eq!(templates.body["data"].as_array().map(Vec::len), Some(2));
    let receipt = template_id(&app, "receipt").await;
    let one = app.get(&format!("/templates/{receipt}"), MAIL_KEY).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.body["data"]["kind"], "transactional");
    assert_eq!(one.body["data"]["expectedDataRepresentation"]["order"]["schemaSlug"], "orders");
    assert_eq!(one.body["data"]["expectedDataRepresentation"]["contact"]["recipient"], true);

    for (path, code) in [
        ("/domains/dom_missing", "domain_not_found"),
        ("/senders/snd_missing", "sender_not_found"),
        ("/topics/top_missing", "topic_not_found"),
        ("/templates/tpl_missing", "template_not_found"),
    ] {
        let missing = app.get(path, MAIL_KEY).await;
        assert_eq!((missing.status, missing.code().clone()), (404, json!(code)), "{path}");
    }
    // Another space's template is not found from alpha.
    let other = app.get(&format!("/templates/{receipt}"), ALPHA_ADMIN).await;
    assert_eq!(other.status, 404);
    assert_eq!(app.get("/templates", ALPHA_ADMIN).await.body["pagination"]["totalCount"], 0);
    // A re-apply keeps the domain's key.
    let before = app.get(&format!("/domains/{id}"), MAIL_KEY).await.body["data"]["records"][1]["value"].clone();
    let again = app.apply_workspace(&mail_workspace(100), true).await;
    assert_eq!(again.events, 0);
    assert_eq!(app.get(&format!("/domains/{id}"), MAIL_KEY).await.body["data"]["records"][1]["value"], before);
}

#[tokio::test]
async fn a_transactional_send_arrives_dkim_signed_with_both_parts_and_escaped_html() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let receipt = template_id(&app, "receipt").await;
    let sent = send(&app, &receipt, &receipt_body("Ada@Example.com", "<b>Ada</b>"), None).await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    assert_eq!(sent.body["data"]["status"], "sent");
    assert_eq!(sent.body["data"]["error"], Value::Null);
    let email_id = sent.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    assert!(email_id.starts_with("em_"));
    let messages = sink.wait_for(1, WAIT).await;
    let message = &messages[0];
    assert_eq!(message["rcptTo"], json!(["ada@example.com"]));
    assert_eq!(message["mailFrom"], format!("bounce+{email_id}@bounces.mail.example.test"));
    assert_eq!(message["messageId"], format!("<{email_id}@mail.example.test>"));
    assert_eq!(message["headers"]["subject"][0], "Order ord-1 for <b>Ada</b>");
    assert!(message["headers"]["from"][0].as_str().is_some_and(|from| from.contains("hello@mail.example.test")));
    assert_eq!(message["text"].as_str().map(str::trim), Some("Hi <b>Ada</b>, you paid 42.5."));
    assert_eq!(message["html"].as_str().map(str::trim), Some("<p>Hi &lt;b&gt;Ada&lt;/b&gt;, you paid 42.5.</p>"));
    assert_eq!(message["dkim"]["valid"], true, "{:?}", message["dkim"]);
    assert_eq!(message["dkim"]["domain"], "mail.example.test");
    assert_eq!(message["dkim"]["selector"], "k1");
    let signed: Vec<&str> =
        message["dkim"]["signedHeaders"].as_array().expect("h=").iter().filter_map(Value::as_str).collect();
    for header in ["from", "to", "subject", "date", "message-id"] {
        assert!(signed.contains(&header), "{header} is signed: {signed:?}");
    }
    assert!(message["headers"].get("list-unsubscribe").is_none(), "transactional mail has no unsubscribe header");
    for part in ["html", "text"] {
        assert!(message[part].as_str().is_some_and(|body| !body.contains("nsubscribe")), "no footer: {message}");
    }
    // The context records were written first: the contact and the order exist.
    let contacts = app.get("/schemas/people/records", MAIL_KEY).await;
    assert_eq!(contacts.body["data"][0]["email"], "ada@example.com");
    assert_eq!(app.get("/schemas/orders/records", MAIL_KEY).await.body["pagination"]["totalCount"], 1);
    // The log holds no rendered content in the clear.
    let clear = app
        .query_i64("SELECT count(*) FROM events WHERE position(convert_to('paid 42.5', 'UTF8') in payload) > 0")
        .await;
    assert_eq!(clear, 0, "rendered bodies are sealed");
}

#[tokio::test]
async fn marketing_mail_needs_consent_and_the_topic_and_carries_one_click_headers() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let (newsletter, promo) = (template_id(&app, "newsletter").await, template_id(&app, "promo").await);
    let body = |consent: bool| json!({"data": {"contact": {"email": "bo@example.com", "newsConsent": consent}}});
    let refused = send(&app, &promo, &body(false), None).await;
    assert_eq!(
        (refused.status, refused.code().clone()),
        (422, json!("recipient_not_subscribed")),
        "{:?}",
        refused.body
    );
    assert!(refused.body["error"].get("emailId").is_none());
    // Consent alone is enough without a topic; a topic also needs a subscription.
    let promo_sent = send(&app, &promo, &body(true), None).await;
    assert_eq!(promo_sent.status, 200, "{:?}", promo_sent.body);
    let email_id = promo_sent.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let refused = send(&app, &newsletter, &body(true), None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_not_subscribed")));
    let messages = sink.wait_for(1, WAIT).await;
    let message = &messages[0];
    assert_eq!(
        message["headers"]["list-unsubscribe"][0],
        format!("<https://api.example.test/v1/emails/{email_id}/unsubscribe>")
    );
    assert_eq!(message["headers"]["list-unsubscribe-post"][0], "List-Unsubscribe=One-Click");
    let signed: Vec<&str> =
        message["dkim"]["signedHeaders"].as_array().expect("h=").iter().filter_map(Value::as_str).collect();
    assert!(signed.contains(&"list-unsubscribe") && signed.contains(&"list-unsubscribe-post"), "{signed:?}");
    assert_eq!(message["dkim"]["valid"], true, "{:?}", message["dkim"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.messages().await.len(), 1, "refused sends send nothing");
}

/// The id of the email a sink message carries, from its Message-ID `<emailId@domain>`.
pub(crate) fn email_id_of(message: &Value) -> String {
    let message_id = message["messageId"].as_str().expect("a Message-ID");
    message_id.trim_start_matches('<').split('@').next().expect("an email id").to_owned()
}

/// Asserts that a marketing message shows, in its HTML and its text part, the footer with its
/// own unsubscribe link (the URL of its `List-Unsubscribe`), naming what the recipient
/// subscribed to.
/// The mail space's sender and postal address as its marketing footers print them.
pub(crate) const POSTAL: &str = "Example Team, Example Inc., 1 Main Street, Springfield, IL 62701";

pub(crate) fn assert_unsubscribe_footer(message: &Value, subscribed_to: &str) {
    let url = format!("https://api.example.test/v1/emails/{}/unsubscribe", email_id_of(message));
    assert_eq!(message["headers"]["list-unsubscribe"][0], format!("<{url}>"), "the same URL as the header");
    let html = message["html"].as_str().expect("an HTML part");
    // The open pixel, when the mail is tracked, comes after the footer.
    let pixel = format!("\n<img src=\"https://api.example.test/v1/emails/{}/open?sig=", email_id_of(message));
    let html = html.rsplit_once(&pixel).map_or(html, |(before, _)| before);
    let link = format!("<a href=\"{url}\" style=\"color:#555555;text-decoration:underline\">");
    assert!(html.contains(&format!("You receive this because you subscribed to {subscribed_to}. {link}")), "{html}");
    assert!(html.trim_end().ends_with("Unsubscribe or change your email preferences</a></p>"), "{html}");
    // Above it, the sender's name and postal address (CAN-SPAM).
    assert!(html.contains(&format!(">{POSTAL}</p>\n<p style=")), "{html}");
    let text = message["text"].as_str().expect("a text part");
    let footer = format!(
        "\n\n-- \n{POSTAL}\nYou receive this because you subscribed to {subscribed_to}.\n\
         Unsubscribe or change your email preferences: {url}"
    );
    assert!(text.trim_end().ends_with(&footer), "{text:?}");
    assert_eq!(message["dkim"]["valid"], true, "the footer is signed: {:?}", message["dkim"]);
}

/// The mail workspace with its `promo` template (marketing, no topic) changed by `change`.
pub(crate) fn mail_workspace_with_promo(change: impl FnOnce(&mut Value)) -> String {
    let mut workspace: Value = serde_json::from_str(&mail_workspace(100)).expect("the workspace is JSON");
    let promo = workspace["spaces"]
        .as_array_mut()
        .and_then(|spaces| spaces.iter_mut().find(|space| space["slug"] == "mail"))
        .and_then(|space| space["templates"].as_array_mut())
        .and_then(|templates| templates.iter_mut().find(|template| template["slug"] == "promo"))
        .expect("the promo template");
    change(promo);
    workspace.to_string()
}

#[tokio::test]
async fn marketing_mail_shows_its_unsubscribe_link_unless_the_template_places_it_itself() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let promo = template_id(&app, "promo").await;
    let body = json!({"data": {"contact": {"email": "foot@example.com", "newsConsent": true}}});
    let sent = send(&app, &promo, &body, None).await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    let messages = sink.wait_for(1, WAIT).await;
    assert_eq!(email_id_of(&messages[0]), sent.body["data"]["emailId"].as_str().expect("emailId"));
    // No topic: the footer names the sender.
    assert_unsubscribe_footer(&messages[0], "email from Example Team");
    assert!(messages[0]["html"].as_str().is_some_and(|html| html.starts_with("<p>Promo</p>\n<p style=")));
    assert!(messages[0]["text"].as_str().is_some_and(|text| text.starts_with("Promo\n\n-- \n")));

    // A template that places the link itself gets no unsubscribe footer, in a whole HTML
    // document: only the sender's postal address, which every marketing email carries.
    let placed = mail_workspace_with_promo(|promo| {
        promo["html"] = json!(r#"<html><body><p>Promo</p><a href="{{ unsubscribeUrl }}">Leave</a></body></html>"#);
        promo["text"] = json!("Promo. Leave: {{ unsubscribeUrl }}");
    });
    app.apply_workspace(&placed, true).await;
    let second = send(&app, &promo, &body, None).await;
    assert_eq!(second.status, 200, "{:?}", second.body);
    let email_id = second.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let messages = sink.wait_for(2, WAIT).await;
    let message = messages.iter().find(|message| email_id_of(message) == email_id).expect("the second message");
    let url = format!("https://api.example.test/v1/emails/{email_id}/unsubscribe");
    let html = message["html"].as_str().map(str::trim).expect("html");
    let address = "<p style=\"margin:24px 0 0;font-size:12px;line-height:1.5;color:#555555\">";
    let start = format!(
        "<html><body><p>Promo</p><a href=\"{url}\">Leave</a>{address}{POSTAL}</p>\n<img src=\"{}/open?sig=",
        &url[..url.len() - 12]
    );
    assert!(html.starts_with(&start) && html.ends_with("</body></html>"), "the pixel ends the body: {html}");
    assert_eq!(message["text"].as_str().map(str::trim), Some(format!("Promo. Leave: {url}\n\n{POSTAL}").as_str()));
    assert_eq!(message["headers"]["list-unsubscribe"][0], format!("<{url}>"));
    assert_eq!(message["dkim"]["valid"], true, "{:?}", message["dkim"]);
    // The template's own link unsubscribes.
    let path = url.trim_start_matches("https://api.example.test/v1");
    let unsubscribed = public(&app, reqwest::Method::POST, path, Some("List-Unsubscribe=One-Click")).await;
    assert_eq!(unsubscribed.status(), 200);
    let unsubscribed: Value = unsubscribed.json().await.expect("JSON");
    assert_eq!(unsubscribed["data"]["unsubscribed"], true, "{unsubscribed}");
    let refused = send(&app, &promo, &json!({"data": {"contact": {"email": "foot@example.com"}}}), None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_not_subscribed")));

    // The variable's name cannot be a data key of a marketing template.
    let clash = mail_workspace_with_promo(|promo| {
        promo["data"]["unsubscribeUrl"] = json!({"schema": "orders"});
    });
    let parsed = command_service::authoring::parse(&clash).expect("the workspace parses");
    let log = platform::log::EventLog::start(app.pool.clone(), 16);
    let refused =
        command_service::authoring::apply(&app.pool, &log, &parsed, Default::default()).await.expect_err("refused");
    assert!(format!("{refused:#}").contains("is a variable of the marketing footer"), "{refused:#}");
}

#[tokio::test]
async fn suppressions_block_every_send_and_the_allowance_runs_out() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 2).await;
    let receipt = template_id(&app, "receipt").await;
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "cy@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    let refused = send(&app, &receipt, &receipt_body("cy@example.com", "Cy"), None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_suppressed")), "{:?}", refused.body);
    for n in 0..2 {
        let sent = send(&app, &receipt, &receipt_body(&format!("d{n}@example.com"), "D"), None).await;
        assert_eq!(sent.status, 200, "{:?}", sent.body);
    }
    let over = send(&app, &receipt, &receipt_body("e@example.com", "E"), None).await;
    assert_eq!((over.status, over.code().clone()), (402, json!("email_limit_reached")), "{:?}", over.body);
    sink.wait_for(2, WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.messages().await.len(), 2);
}

/// A send that names its recipient by id is decided on the suppression of the address the
/// contact has, as is one that gives that address; one that gives the contact a new address,
/// on the new one. (The address a send
/// gives is read with the identities; the contact's own only once the contact is known.)
#[tokio::test]
async fn a_send_reads_the_suppression_of_the_address_it_gives_or_the_one_the_contact_has() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 10).await;
    let receipt = template_id(&app, "receipt").await;
    let made = app.post("/schemas/people/records", MAIL_KEY, &json!({"email": "hal@example.com"})).await;
    assert_eq!(made.status, 201, "{:?}", made.body);
    let hal = made.body["data"]["id"].as_str().expect("id").to_owned();
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "hal@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    let order = json!({"externalId": "ord-h", "total": 1});
    let by_id = json!({"data": {"contact": {"id": hal, "firstName": "Hal"}, "order": order}});
    let refused = send(&app, &receipt, &by_id, None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_suppressed")), "{:?}", refused.body);
    // The address given, which the contact already has.
    let given = json!({"data": {"contact": {"email": "hal@example.com"}, "order": order}});
    let refused = send(&app, &receipt, &given, None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_suppressed")), "{:?}", refused.body);
    let moved = json!({"data": {"contact": {"id": hal, "email": "hal.new@example.com"}, "order": order}});
    let sent = send(&app, &receipt, &moved, None).await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    assert_eq!(sent.body["data"]["status"], "sent", "{:?}", sent.body);
    sink.wait_for(1, WAIT).await;
    let messages = sink.messages().await;
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["rcptTo"], json!(["hal.new@example.com"]), "sent to the new address");
}

/// A send to known records reads each one once: the holder its identities matched is the
/// record its upsert writes, not read a second time (counted with `pg_stat_statements`).
#[tokio::test]
async fn a_send_to_known_records_reads_each_of_them_once() {
    const SENDS: i64 = 4;
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 10).await;
    let receipt = template_id(&app, "receipt").await;
    let first = send(&app, &receipt, &receipt_body("kit@example.com", "Kit"), None).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let client = app.pool.get().await.expect("client");
    client.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.expect("the extension");
    let database = app.query_string("SELECT current_database()").await;
    let this_database = format!("(SELECT oid FROM pg_database WHERE datname = '{database}')");
    app.query_string(&format!("SELECT pg_stat_statements_reset(0, {this_database}, 0)::text")).await;
    for _ in 0..SENDS {
        let again = send(&app, &receipt, &receipt_body("kit@example.com", "Kit"), None).await;
        assert_eq!(again.status, 200, "{:?}", again.body);
    }
    let reads = app
        .query_i64(&format!(
            "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements
             WHERE dbid = {this_database} AND query LIKE 'SELECT l.stream_version, l.event_type%'"
        ))
        .await;
    // The contact and the order, one read of both records' holders each a send.
    assert_eq!(reads, 2 * SENDS, "reads of records over {SENDS} sends");
}

/// The holders of several upserts' identities, read in one statement, are each upsert's own:
/// two asks in one schema do not see each other's holders, and an identity nobody holds is
/// absent.
#[tokio::test]
async fn identities_read_together_are_told_apart_by_who_asked() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 10).await;
    let mut ids = Vec::new();
    for address in ["ivy@example.com", "jo@example.com"] {
        let made = app.post("/schemas/people/records", MAIL_KEY, &json!({"email": address})).await;
        assert_eq!(made.status, 201, "{:?}", made.body);
        ids.push(made.body["data"]["id"].as_str().expect("id").to_owned());
    }
    let schema = app.query_strings("SELECT schema_id FROM record_identities WHERE value = 'ivy@example.com'").await;
    let space = app.query_strings("SELECT space_id FROM record_identities WHERE value = 'ivy@example.com'").await;
    let ivy = [("email", "ivy@example.com".to_owned())];
    let jo_and_nobody = [("email", "jo@example.com".to_owned()), ("email", "nobody@example.com".to_owned())];
    let asked: [(&str, &[(&str, String)]); 2] = [(&schema[0], &ivy), (&schema[0], &jo_and_nobody)];
    let client = app.pool.get().await.expect("client");
    let owners = reads::records::identity_owners_of(&client, &space[0], &asked).await.expect("read");
    let holders = |index: usize| -> Vec<(String, String)> {
        owners[index].iter().map(|((_, value), record)| (value.clone(), record.clone())).collect()
    };
    assert_eq!(holders(0), vec![("ivy@example.com".to_owned(), ids[0].clone())]);
    assert_eq!(holders(1), vec![("jo@example.com".to_owned(), ids[1].clone())]);
}

/// Sends one receipt (answered 200) and then another, refused 402 `email_limit_reached`: an
/// allowance of one used up. `prefix` names the two addresses.
async fn use_up_an_allowance_of_one(app: &TestApp, receipt: &str, prefix: &str) {
    let sent = send(app, receipt, &receipt_body(&format!("{prefix}1@example.com"), "K"), None).await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    let over = send(app, receipt, &receipt_body(&format!("{prefix}2@example.com"), "K"), None).await;
    assert_eq!((over.status, over.code().clone()), (402, json!("email_limit_reached")), "{:?}", over.body);
}

/// An allowance raised by applying the workspace lets sends go again at once, in the process
/// that kept the template (and the old allowance) from the send it refused.
#[tokio::test]
async fn a_raised_allowance_lets_the_next_send_go_in_the_process_that_kept_the_old_one() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 1).await;
    let receipt = template_id(&app, "receipt").await;
    use_up_an_allowance_of_one(&app, &receipt, "k").await;
    app.apply_workspace(&mail_workspace(5), true).await;
    let again = send(&app, &receipt, &receipt_body("k3@example.com", "K"), None).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(again.body["data"]["status"], "sent", "{:?}", again.body);
}

/// A send whose append the database refuses (here the allowance's guard) wrote no outbox row:
/// the lease it set up for its hand-off stands down at once, rather than looking for the row to
/// give back for 25 s (which a lost race, decided again, would leave behind at every try).
#[tokio::test]
async fn a_send_the_database_refuses_leaves_no_hand_off_to_give_back() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 1).await;
    let receipt = template_id(&app, "receipt").await;
    use_up_an_allowance_of_one(&app, &receipt, "g").await;
    let origin = app.command_url.trim_end_matches("/v1");
    let metrics = app.http.get(format!("{origin}/metrics")).send().await.expect("sent").text().await.expect("text");
    let given_back = metrics.lines().find_map(|line| line.strip_prefix("email_handoffs_given_back_total "));
    assert_eq!(given_back, None, "no hand-off's lease was given back:\n{metrics}");
    // The refused send left no row, and the one sent is settled.
    let rows = app.query_i64("SELECT count(*) FROM email_outbox").await;
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn bad_bodies_are_refused_and_a_replayed_key_sends_nothing_new() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let receipt = template_id(&app, "receipt").await;
    let content = send(&app, &receipt, &json!({"data": {}, "subject": "mine"}), None).await;
    assert_eq!((content.status, content.code().clone()), (400, json!("template_content_not_accepted")));
    let missing = send(&app, &receipt, &json!({"data": {"contact": {"email": "f@example.com"}}}), None).await;
    assert_eq!((missing.status, missing.code().clone()), (400, json!("invalid_template_data")), "{:?}", missing.body);
    let broken = template_id(&app, "broken").await;
    let unrenderable = send(&app, &broken, &json!({"data": {"contact": {"email": "f@example.com"}}}), None).await;
    assert_eq!((unrenderable.status, unrenderable.code().clone()), (422, json!("template_render_failed")));
    let unknown = send(&app, "tpl_missing", &receipt_body("f@example.com", "F"), None).await;
    assert_eq!((unknown.status, unknown.code().clone()), (404, json!("template_not_found")));
    let forbidden = app
        .send(
            app.request(reqwest::Method::POST, &format!("/templates/{receipt}/send"), Some(MAIL_READER))
                .json(&receipt_body("f@example.com", "F")),
        )
        .await;
    assert_eq!(forbidden.status, 403);

    let first = send(&app, &receipt, &receipt_body("g@example.com", "G"), Some("send-1")).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let replay = send(&app, &receipt, &receipt_body("g@example.com", "G"), Some("send-1")).await;
    assert_eq!(replay.status, 200);
    assert_eq!(replay.header("idempotent-replay"), Some("true"));
    assert_eq!(replay.body, first.body);
    sink.wait_for(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.messages().await.len(), 1, "a replay sends nothing");
}

#[tokio::test]
async fn a_relay_rejection_is_a_failed_send_and_a_refused_mailbox_suppresses_the_address() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let receipt = template_id(&app, "receipt").await;
    // A policy refusal (554) fails the send and suppresses nothing.
    sink.set_mode(json!({"mode": "reject", "code": 554, "message": "policy says no"})).await;
    let failed = send(&app, &receipt, &receipt_body("h@example.com", "H"), None).await;
    assert_eq!(failed.status, 200, "{:?}", failed.body);
    assert_eq!(failed.body["data"]["status"], "failed");
    assert_eq!(failed.body["data"]["error"]["code"], "relay_rejected");
    assert!(failed.body["data"]["error"]["message"].as_str().is_some_and(|m| m.contains("554")), "{:?}", failed.body);
    assert!(failed.body["data"]["emailId"].as_str().is_some_and(|id| id.starts_with("em_")));
    // A refused mailbox (550) is a hard bounce: a provider `bounce` suppression follows.
    sink.set_mode(json!({"mode": "rejectRcpt", "code": 550})).await;
    let bounced = send(&app, &receipt, &receipt_body("h@example.com", "H"), None).await;
    assert_eq!(bounced.body["data"]["status"], "failed", "{:?}", bounced.body);
    let token = bounced.header("consistency-token").expect("a token").to_owned();
    let suppressions = app
        .send(
            app.request(reqwest::Method::GET, "/contacts/suppressions?identifier=h@example.com", Some(MAIL_KEY))
                .header("Consistency-Token", token),
        )
        .await;
    assert_eq!(suppressions.body["data"].as_array().map(Vec::len), Some(1), "{:?}", suppressions.body);
    assert_eq!(suppressions.body["data"][0]["reason"], "bounce");
    let id = suppressions.body["data"][0]["id"].as_str().expect("id");
    let remove =
        app.send(app.request(reqwest::Method::DELETE, &format!("/contacts/suppressions/{id}"), Some(MAIL_KEY))).await;
    assert_eq!(remove.status, 409, "provider suppressions are not removable: {:?}", remove.body);
    sink.set_mode(json!({"mode": "accept"})).await;
    let refused = send(&app, &receipt, &receipt_body("h@example.com", "H"), None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_suppressed")));
    let bounces = app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EmailBounced.v1'").await;
    assert_eq!(bounces, 1);
}

#[tokio::test]
async fn a_confirmation_is_handed_off_exactly_once_when_the_command_service_dies_before_its_hand_off() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    // A command service that pauses between the append and the hand-off, killed in that pause.
    // A form's confirmation is handed off after the answer (the outbox row stays `pending`
    // until its hand-off claims it), so the outbox worker sends what the dead process left.
    let (mut doomed, url) = sender_process(&app, &sink, Some(60_000)).await;
    const SENDS: usize = 3;
    submit_signups(&app, &url, "crash", SENDS).await;
    let pending = app.query_i64("SELECT count(*) FROM email_outbox WHERE state = 'pending'").await;
    assert_eq!(pending, SENDS as i64, "appended, not claimed");
    assert!(sink.messages().await.is_empty(), "nothing left before the kill");
    // The relay refuses for now at first: the outbox worker retries on its schedule.
    sink.set_mode(json!({"mode": "tempfail", "code": 451})).await;
    doomed.0.kill().expect("kill -9");
    let deadline = std::time::Instant::now() + WAIT;
    while sink.rejected().await.len() < SENDS {
        assert!(std::time::Instant::now() < deadline, "the worker did not try the orphaned sends");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sink.set_mode(json!({"mode": "accept"})).await;
    let messages = sink.wait_for(SENDS, WAIT).await;
    // Once every row is recorded sent, no process holds or may take a claim on one: what the
    // relay has then is all it gets.
    let deadline = std::time::Instant::now() + WAIT;
    while app.query_i64("SELECT count(*) FROM email_outbox WHERE state = 'sent'").await < SENDS as i64 {
        assert!(std::time::Instant::now() < deadline, "the sends were not recorded sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut ids = sink.message_ids().await;
    assert_eq!(ids.len(), SENDS, "each confirmation left exactly once: {ids:?}");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), SENDS);
    assert!(messages.iter().all(|message| message["dkim"]["valid"] == true));
    let rows = app.query_i64("SELECT count(*) FROM email_outbox").await;
    assert_eq!(rows, SENDS as i64, "one row each, each recorded sent");
}

/// Submits the signup form `count` times through the command service at `url`, as
/// `{prefix}{n}@example.com`; each is answered before its confirmation's hand-off.
async fn submit_signups(app: &TestApp, url: &str, prefix: &str, count: usize) {
    for index in 0..count {
        let submitted = app
            .http
            .post(format!("{url}/forms/{SIGNUP_FORM}/submit"))
            .json(&json!({"email_address": format!("{prefix}{index}@example.com"), "first_name": "Signup"}))
            .send()
            .await
            .expect("an answer");
        assert_eq!(submitted.status().as_u16(), 200, "answered before the hand-off");
    }
}

/// An email the outbox cannot rebuild from the log (here, one the log never scheduled: a
/// defect) is given back for a later attempt on the retry schedule, with the reason, and the
/// emails claimed beside it go out: it neither fails the worker's steps (whose backoff would
/// hold every later email back) nor is claimed again at once in each step.
#[tokio::test]
async fn an_email_the_outbox_cannot_rebuild_is_deferred_and_the_others_go_out() {
    let sink = SmtpSink::start().await;
    let email = platform::settings::EmailSettings { retry_schedule_ms: vec![60_000], ..test_email(&sink) };
    let app = mail_app_with(&sink, 100, email).await;
    // Confirmations left `pending` by a process killed before its hand-offs.
    let (mut doomed, url) = sender_process(&app, &sink, Some(60_000)).await;
    const SENDS: usize = 3;
    submit_signups(&app, &url, "beside", SENDS).await;
    doomed.0.kill().expect("kill -9");
    app.query_i64(
        "WITH added AS (INSERT INTO email_outbox (email_id, space_id, created_at)
                        SELECT 'em_never_scheduled', space_id, now() - interval '1 minute'
                        FROM email_outbox LIMIT 1 RETURNING 1)
         SELECT count(*) FROM added",
    )
    .await;

    sink.wait_for(SENDS, WAIT).await;
    let deadline = Instant::now() + WAIT;
    let (state, attempts, deferred_for, error) = loop {
        let row = app
            .query_string(
                "SELECT state || '|' || attempts || '|' || extract(epoch FROM next_attempt_at - now())::int
                        || '|' || coalesce(last_error, '')
                 FROM email_outbox WHERE email_id = 'em_never_scheduled'",
            )
            .await;
        let parts: Vec<String> = row.splitn(4, '|').map(str::to_owned).collect();
        if parts[1] != "0" && parts[0] == "pending" {
            break (
                parts[0].clone(),
                parts[1].parse::<i64>().expect("attempts"),
                parts[2].parse::<i64>().expect("secs"),
                parts[3].clone(),
            );
        }
        assert!(Instant::now() < deadline, "the email was never tried: {row}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(state, "pending");
    assert_eq!(attempts, 1, "tried once, not in every step");
    assert!(deferred_for > 30, "given back for the schedule's minute, not due at once: {deferred_for} s");
    assert!(error.contains("could not be rebuilt"), "{error}");
    // Still deferred a moment later: not claimed again in the steps since.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attempts =
        app.query_i64("SELECT attempts::bigint FROM email_outbox WHERE email_id = 'em_never_scheduled'").await;
    assert_eq!(attempts, 1);
    let sent = app.query_i64("SELECT count(*) FROM email_outbox WHERE state = 'sent'").await;
    assert_eq!(sent, SENDS as i64, "the others went out and were recorded");
}

/// A command service of its own process relaying to `sink`, pausing `handoff_delay_ms`
/// between a send's append and its hand-off; the process and its base URL.
async fn sender_process(app: &TestApp, sink: &SmtpSink, handoff_delay_ms: Option<u64>) -> (ChildGuard, String) {
    sender_process_on(app, sink, handoff_delay_ms, free_port()).await
}

/// [`sender_process`] listening on `port`.
async fn sender_process_on(
    app: &TestApp,
    sink: &SmtpSink,
    handoff_delay_ms: Option<u64>,
    port: u16,
) -> (ChildGuard, String) {
    let mut env = vec![("APP__HTTP__PORT", port.to_string()), ("APP__EMAIL__RELAY_URL", sink.relay_url())];
    if let Some(delay) = handoff_delay_ms {
        env.push(("APP__EMAIL__HANDOFF_DELAY_MS", delay.to_string()));
    }
    let process = spawn_binary("command-service", &["serve"], &app.database_url, &env);
    let url = format!("http://127.0.0.1:{port}/v1");
    crate::log::wait_until_listening(&app.http, &url).await;
    (process, url)
}

/// Sends `template` to `to` under `key` through a sender process of its own
/// ([`sender_process`]), and kills that process (kill -9) once the email's outbox row is in
/// `state`; when it was killed.
async fn sender_killed_at(
    app: &TestApp,
    sink: &SmtpSink,
    handoff_delay_ms: Option<u64>,
    send: (&str, &str, &str),
    state: &str,
) -> Instant {
    sender_killed_on(app, sink, handoff_delay_ms, send, state, free_port()).await
}

/// [`sender_killed_at`] with the sender listening on `port`.
async fn sender_killed_on(
    app: &TestApp,
    sink: &SmtpSink,
    handoff_delay_ms: Option<u64>,
    (template, key, to): (&str, &str, &str),
    state: &str,
    port: u16,
) -> Instant {
    let (mut doomed, url) = sender_process_on(app, sink, handoff_delay_ms, port).await;
    let request = app
        .http
        .post(format!("{url}/templates/{template}/send"))
        .bearer_auth(MAIL_KEY)
        .header("Idempotency-Key", key)
        .json(&receipt_body(to, "Gone"));
    let in_flight = tokio::spawn(async move {
        let _ = request.send().await;
    });
    wait_for_outbox_row(app, key, state).await;
    doomed.0.kill().expect("kill -9");
    let killed_at = Instant::now();
    in_flight.await.expect("joins");
    killed_at
}

/// Retries `key` through the live app until it is no longer told to come again; the answer.
async fn retry_until_settled(app: &TestApp, template: &str, key: &str, to: &str, killed_at: Instant) -> TestResponse {
    loop {
        let retry = app
            .send(
                app.request(reqwest::Method::POST, &format!("/templates/{template}/send"), Some(MAIL_KEY))
                    .header("Idempotency-Key", key)
                    .json(&receipt_body(to, "Gone")),
            )
            .await;
        if retry.code() != "idempotency_conflict" {
            return retry;
        }
        assert_eq!(retry.header("retry-after"), Some("1"), "told when to come again");
        // The dead process is noticed within DEAD_AFTER (5 s), its row taken over at the
        // outbox worker's next poll: well within the 10 s a client may wait.
        assert!(killed_at.elapsed() < Duration::from_secs(10), "{key} still waits after {:?}", killed_at.elapsed());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn a_send_claim_dies_with_its_holder_and_a_retry_gets_its_answer_within_seconds() {
    let sink = SmtpSink::start().await;
    // A grace and a lease far longer than the wait: only the holder's death can end it.
    let email = platform::settings::EmailSettings { handoff_grace_ms: 120_000, ..test_email(&sink) };
    let app = mail_app_with(&sink, 100, email).await;
    let receipt = template_id(&app, "receipt").await;
    // 1. A sender that dies between its append and its hand-off. Its append claimed the
    // email for its own hand-off (the row is `attempting` in the append's own transaction:
    // nothing is written between the append and the relay), so the email is settled as
    // unknown once the process stops beating, never handed off by another, and the retry is
    // told the outcome is unknown.
    let killed_at = sender_killed_at(
        &app,
        &sink,
        Some(60_000),
        (&receipt, "died-before-relay", "before@example.com"),
        "attempting",
    )
    .await;
    let one_transaction = app
        .query_i64(
            "SELECT count(*) FROM email_outbox o JOIN events e
               ON e.stream_id = 'email-' || o.email_id AND e.event_type = 'EmailScheduled.v1'
             WHERE o.xmin = e.xmin AND o.state = 'attempting'",
        )
        .await;
    assert_eq!(one_transaction, 1, "the claim is written by the scheduling append");
    let unknown = retry_until_settled(&app, &receipt, "died-before-relay", "before@example.com", killed_at).await;
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (409, Some("idempotency_outcome_unknown")),
        "{:?}",
        unknown.body
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(sink.messages().await.is_empty(), "never handed off by another process");

    // 2. A sender that dies in the middle of its SMTP exchange: the relay may have the
    // message, so it is never sent again; the row is settled as unknown at once (not when its
    // lease of a minute runs out), and the retry is told the outcome is unknown.
    sink.clear().await;
    sink.set_mode(json!({"mode": "delayData", "seconds": 60})).await;
    let killed_at =
        sender_killed_at(&app, &sink, None, (&receipt, "died-attempting", "attempting@example.com"), "attempting")
            .await;
    let unknown = retry_until_settled(&app, &receipt, "died-attempting", "attempting@example.com", killed_at).await;
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (409, Some("idempotency_outcome_unknown")),
        "{:?}",
        unknown.body
    );
    // The retry's answer is decided from the holder's death alone; the row itself is settled by
    // the outbox worker's next poll, which may come just after that answer.
    let deadline = Instant::now() + WAIT;
    loop {
        let state = app
            .query_i64("SELECT count(*) FROM email_outbox WHERE state = 'unknown' AND claim_scope_key IS NOT NULL")
            .await;
        if state == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "both settled as unknown: {state} are");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sink.set_mode(json!({"mode": "accept"})).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // The sink may keep what the dead exchange had sent it (as a relay might): one copy at most.
    let copies = sink.messages().await.len();
    assert!(copies <= 1, "never handed off again: {copies} copies");
}

#[tokio::test]
async fn a_claim_of_a_killed_process_is_taken_over_as_soon_as_its_replacement_listens_in_its_place() {
    let sink = SmtpSink::start().await;
    let email = platform::settings::EmailSettings { handoff_grace_ms: 120_000, ..test_email(&sink) };
    let app = mail_app_with(&sink, 100, email).await;
    let receipt = template_id(&app, "receipt").await;
    // A sender on a fixed port dies between its append and its hand-off, holding the claim.
    let port = free_port();
    let send = (receipt.as_str(), "replaced", "replaced@example.com");
    sender_killed_on(&app, &sink, Some(60_000), send, "attempting", port).await;
    // Its last beat is made to look fresh for an hour: by its beats alone, it would keep the
    // claim that long.
    let owner = app
        .query_strings(
            "SELECT o.owner::text FROM email_outbox o JOIN idempotency_records r ON r.scope_key = o.claim_scope_key
             WHERE r.idempotency_key = 'replaced'",
        )
        .await
        .remove(0);
    let fresh = app
        .query_i64(&format!(
            "WITH fresh AS (UPDATE process_beats SET beat_at = now() + interval '1 hour',
                     available_at = (SELECT available + 3600 FROM beat_clock)
                 WHERE process_id = '{owner}' RETURNING 1)
             SELECT count(*) FROM fresh"
        ))
        .await;
    assert_eq!(fresh, 1, "the dead sender's beat");
    let retry = || {
        app.request(reqwest::Method::POST, &format!("/templates/{receipt}/send"), Some(MAIL_KEY))
            .header("Idempotency-Key", "replaced")
            .json(&receipt_body("replaced@example.com", "Gone"))
    };
    assert_eq!(app.send(retry()).await.code().as_str(), Some("idempotency_conflict"), "held by a live-looking process");
    // Its replacement listens on its port: the slot is its own, and the dead one's row goes.
    let killed_at = Instant::now();
    let (_replacement, _) = sender_process_on(&app, &sink, None, port).await;
    let gone = format!("SELECT count(*) FROM process_beats WHERE process_id = '{owner}'");
    let deadline = Instant::now() + WAIT;
    while app.query_i64(&gone).await != 0 {
        assert!(Instant::now() < deadline, "the replacement never took the slot over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let settled = retry_until_settled(&app, &receipt, "replaced", "replaced@example.com", killed_at).await;
    assert_eq!(
        (settled.status, settled.code().as_str()),
        (409, Some("idempotency_outcome_unknown")),
        "{:?}",
        settled.body
    );
}

/// A command service of its own process relaying to `sink`, whose database sits behind a
/// fault proxy, pausing `handoff_delay_ms` before each hand-off: the process, its base URL
/// and the proxy.
async fn proxied_sender(
    app: &TestApp,
    sink: &SmtpSink,
    handoff_delay_ms: u64,
) -> (ChildGuard, String, crate::fault_proxy::FaultProxy) {
    app.command_service_behind_proxy(&[
        ("APP__EMAIL__RELAY_URL", sink.relay_url()),
        ("APP__EMAIL__HANDOFF_DELAY_MS", handoff_delay_ms.to_string()),
    ])
    .await
}

#[tokio::test]
async fn a_live_sender_that_lost_its_database_after_the_relay_took_the_message_records_it_sent() {
    use crate::fault_proxy::Fault;
    let sink = SmtpSink::start().await;
    // A grace far longer than the test: the outbox worker leaves the sender's email alone.
    let email = platform::settings::EmailSettings { handoff_grace_ms: 120_000, ..test_email(&sink) };
    let app = mail_app_with(&sink, 100, email).await;
    let receipt = template_id(&app, "receipt").await;
    // The relay holds DATA 1 s, so the exchange is under way when the database goes. (The cut
    // stays shorter than `DEAD_AFTER`: the sender must not be presumed dead, which is
    // another test's case.)
    let (_sender, url, proxy) = proxied_sender(&app, &sink, 0).await;
    sink.set_mode(json!({"mode": "delayData", "seconds": 1})).await;
    let request = app
        .http
        .post(format!("{url}/templates/{receipt}/send"))
        .bearer_auth(MAIL_KEY)
        .header("Idempotency-Key", "cut-after-relay")
        .json(&receipt_body("cut@example.com", "Cut"));
    let in_flight = tokio::spawn(async move {
        let response = request.send().await.expect("an answer");
        (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
    });
    wait_for_outbox_row(&app, "cut-after-relay", "attempting").await;
    // The database goes away mid-exchange and stays away after the relay accepted.
    proxy.set(Fault::Cut);
    assert_eq!(sink.wait_for(1, WAIT).await.len(), 1, "the relay took the message");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attempting = app.query_i64("SELECT count(*) FROM email_outbox WHERE state = 'attempting'").await;
    assert_eq!(attempting, 1, "nothing can be recorded while the database is away");
    proxy.set(Fault::Pass);
    // The sender, alive all along, records what it knows once the database is back: the
    // caller gets "sent", not an unknown outcome, and the email is not left to its lease.
    let (status, body) = in_flight.await.expect("joins");
    assert_eq!((status, &body["data"]["status"]), (200, &json!("sent")), "{body}");
    let sent = app.query_i64("SELECT count(*) FROM email_outbox WHERE state = 'sent'").await;
    assert_eq!(sent, 1, "recorded sent");
    let replayed = send(&app, &receipt, &receipt_body("cut@example.com", "Cut"), Some("cut-after-relay")).await;
    assert_eq!((replayed.status, replayed.header("idempotent-replay")), (200, Some("true")), "{:?}", replayed.body);
    assert_eq!(replayed.body["data"]["status"], "sent");
    sink.set_mode(json!({"mode": "accept"})).await;
    assert_eq!(sink.messages().await.len(), 1, "sent once");
}

#[tokio::test]
async fn a_hand_off_claim_whose_answer_was_lost_is_given_back_and_the_email_goes_out() {
    use crate::fault_proxy::Fault;
    let sink = SmtpSink::start().await;
    // A grace far longer than the test: only the sender giving its claim back lets the
    // outbox worker hand the email off within it.
    let email = platform::settings::EmailSettings { handoff_grace_ms: 120_000, ..test_email(&sink) };
    let app = mail_app_with(&sink, 100, email).await;
    // A form's confirmation: appended `pending`, then claimed by the hand-off that follows
    // the answer (a template send's append claims its row itself; see the next test).
    let (_sender, url, proxy) = proxied_sender(&app, &sink, 1_000).await;
    let submitted = app
        .http
        .post(format!("{url}/forms/{SIGNUP_FORM}/submit"))
        .json(&json!({"email_address": "lost-claim@example.com", "first_name": "Lost"}))
        .send()
        .await
        .expect("an answer");
    assert_eq!(submitted.status().as_u16(), 200);
    // The email is appended, pending; its row is locked so the sender's claim waits on it.
    let pending = "SELECT count(*) FROM email_outbox WHERE state = 'pending'";
    app.wait_for_count(pending, "the confirmation was appended").await;
    let mut holder = app.pool.get().await.expect("client");
    let lock = holder.transaction().await.expect("begins");
    lock.execute("SELECT 1 FROM email_outbox WHERE state = 'pending' FOR UPDATE", &[]).await.expect("locks");
    let waiting = "SELECT count(*) FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock'
                     AND query LIKE 'UPDATE email_outbox%attempting%'";
    app.wait_for_count(waiting, "the sender's claim waits on the row").await;
    // Its connection is cut while the claim waits, so the sender never hears that it was
    // made; then the claim goes through on the server.
    proxy.set(Fault::Cut);
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.commit().await.expect("unlocks");
    let attempting = "SELECT count(*) FROM email_outbox WHERE state = 'attempting'";
    app.wait_for_count(attempting, "the claim was made").await;
    proxy.set(Fault::Pass);
    let back = Instant::now();
    // The sender, alive, gives the claim back once its database is back, and the outbox
    // worker hands the email off: within seconds, not after the claim's lease.
    assert_eq!(sink.wait_for(1, Duration::from_secs(10)).await.len(), 1, "sent");
    assert!(back.elapsed() < Duration::from_secs(10), "given back within seconds");
    let sent = "SELECT count(*) FROM email_outbox WHERE state = 'sent'";
    app.wait_for_count(sent, "recorded sent").await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(sink.messages().await.len(), 1, "sent once");
}

#[tokio::test]
async fn a_send_whose_append_committed_after_its_answer_was_lost_gives_its_claim_back_and_the_email_goes_out() {
    lost_append_answer(Duration::ZERO).await;
}

/// The same when the give-back is slow: the sender's background settling of the claim, tried
/// every second once its database is back, comes first. It must not mark the claim
/// unresolved, since the append handed it to the email, whose hand-off records the answer;
/// a retry then gets "sent", not `idempotency_outcome_unknown` for an email that goes out.
#[tokio::test]
async fn a_lost_append_answer_is_not_settled_as_unknown_while_its_email_is_given_back() {
    lost_append_answer(Duration::from_millis(2_500)).await;
}

/// A give-back that cannot land (its row held past the sender's grace of 5 s): the retry is
/// told the outcome is unknown within seconds, not after the claim's minute, and the email
/// still goes out once, when the row is given back.
#[tokio::test]
async fn a_lost_append_answer_whose_give_back_is_stuck_is_unknown_within_seconds() {
    lost_append_answer(Duration::from_millis(9_000)).await;
}

/// A keyed template send whose append commits while the sender's connection is cut; once the
/// database is back, the email row is held for `give_back_after` (a lock the sender's
/// give-back waits on), then the retry must get the replayed "sent" and the email go out once.
async fn lost_append_answer(give_back_after: Duration) {
    use crate::fault_proxy::Fault;
    let sink = SmtpSink::start().await;
    // A grace far longer than the test: only the sender giving back the claim its append
    // took lets the outbox worker send the email within the test (the claim's lease is about
    // a minute).
    let email = platform::settings::EmailSettings { handoff_grace_ms: 120_000, ..test_email(&sink) };
    let app = mail_app_with(&sink, 100, email).await;
    let receipt = template_id(&app, "receipt").await;
    // The append's commit takes two seconds (a deferred trigger on the outbox row), so the
    // sender's connection can be cut while its COMMIT is under way: the commit lands, and the
    // sender never hears of it.
    let client = app.pool.get().await.expect("client");
    client
        .batch_execute(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON email_outbox
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();",
        )
        .await
        .expect("the trigger");
    let (_sender, url, proxy) = proxied_sender(&app, &sink, 0).await;
    let body = receipt_body("lost-append@example.com", "Lost");
    let request = app
        .http
        .post(format!("{url}/templates/{receipt}/send"))
        .bearer_auth(MAIL_KEY)
        .header("Idempotency-Key", "lost-append")
        .json(&body);
    let in_flight = tokio::spawn(async move { request.send().await.map(|response| response.status().as_u16()) });
    let committing = "SELECT count(*) FROM pg_stat_activity
                      WHERE datname = current_database() AND wait_event = 'PgSleep' AND query ILIKE 'COMMIT%'";
    app.wait_for_count(committing, "the sender's append is committing").await;
    proxy.set(Fault::Cut);
    assert_eq!(in_flight.await.expect("joins").expect("an answer"), 503, "the sender could not tell");
    wait_for_outbox_row(&app, "lost-append", "attempting").await;
    client.batch_execute("DROP TRIGGER slow_commit ON email_outbox").await.expect("dropped");
    let holder = app.pool.get().await.expect("client");
    let (held, holding) = tokio::sync::oneshot::channel();
    let released = tokio::spawn(async move {
        holder.batch_execute("BEGIN; SELECT FROM email_outbox FOR UPDATE").await.expect("the row held");
        let _ = held.send(());
        tokio::time::sleep(give_back_after).await;
        holder.batch_execute("COMMIT").await.expect("released");
    });
    holding.await.expect("the row is held");
    proxy.set(Fault::Pass);
    let back = Instant::now();
    // The sender, alive, gives back the claim its append took once its database is back; the
    // outbox worker hands the email off; the retry gets "sent", not an unknown outcome after
    // the claim's lease.
    let settled = loop {
        let retry = send(&app, &receipt, &body, Some("lost-append")).await;
        if retry.code() != "idempotency_conflict" {
            break retry;
        }
        assert!(back.elapsed() < Duration::from_secs(10), "settled within seconds: {:?}", retry.body);
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    if give_back_after < Duration::from_secs(5) {
        assert_eq!((settled.status, settled.header("idempotent-replay")), (200, Some("true")), "{:?}", settled.body);
        assert_eq!(settled.body["data"]["status"], "sent");
        released.await.expect("joins");
        assert!(back.elapsed() >= give_back_after, "answered only after the give-back");
    } else {
        assert_eq!(
            (settled.status, settled.code().as_str()),
            (409, Some("idempotency_outcome_unknown")),
            "{:?}",
            settled.body
        );
        assert!(back.elapsed() < give_back_after, "answered before the give-back: {:?}", back.elapsed());
        released.await.expect("joins");
    }
    assert_eq!(sink.wait_for(1, WAIT).await.len(), 1, "sent once");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(sink.messages().await.len(), 1, "sent once");
}

/// Waits until the email sent under `key` has its outbox row in `state`.
async fn wait_for_outbox_row(app: &TestApp, key: &str, state: &str) {
    let sql = format!(
        "SELECT count(*) FROM email_outbox o JOIN idempotency_records r ON r.scope_key = o.claim_scope_key
         WHERE r.idempotency_key = '{key}' AND o.state = '{state}'"
    );
    let deadline = Instant::now() + WAIT;
    while app.query_i64(&sql).await == 0 {
        assert!(Instant::now() < deadline, "the send under {key} did not reach {state}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_relay_that_is_down_fails_the_inline_send_for_good() {
    let sink = SmtpSink::start().await;
    let mut email = test_email(&sink);
    // Nothing listens on this port.
    email.relay_url = Some(format!("smtp://127.0.0.1:{}", free_port()).into());
    let app = mail_app_with(&sink, 100, email).await;
    let receipt = template_id(&app, "receipt").await;
    let failed = send(&app, &receipt, &receipt_body("down@example.com", "Down"), None).await;
    assert_eq!(failed.status, 200, "{:?}", failed.body);
    assert_eq!(failed.body["data"]["status"], "failed");
    assert_eq!(failed.body["data"]["error"]["code"], "relay_unavailable");
    let state = app.query_i64("SELECT count(*) FROM email_outbox WHERE state = 'failed'").await;
    assert_eq!(state, 1, "an inline failure is final: a new send is safe");
}

/// A public request (no API key) to the command or query service.
async fn public(app: &TestApp, method: reqwest::Method, path: &str, form: Option<&str>) -> reqwest::Response {
    let base = if method == reqwest::Method::GET { &app.query_url } else { &app.command_url };
    let mut request = app.http.request(method, format!("{base}{path}"));
    if let Some(form) = form {
        request = request.header("Content-Type", "application/x-www-form-urlencoded").body(form.to_owned());
    }
    request.send().await.expect("the request")
}

#[tokio::test]
async fn one_click_unsubscribe_withdraws_consent_idempotently_and_a_get_changes_nothing() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let promo = template_id(&app, "promo").await;
    let body = json!({"data": {"contact": {"email": "una@example.com", "newsConsent": true}}});
    let sent = send(&app, &promo, &body, None).await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    let email_id = sent.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let path = format!("/emails/{email_id}/unsubscribe");

    // A link scanner's GET shows a page and changes nothing.
    let page = public(&app, reqwest::Method::GET, &path, None).await;
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"].to_str().is_ok_and(|t| t.starts_with("text/html")));
    let html = page.text().await.expect("the page");
    assert!(
        html.contains(r#"<form method="post" action="unsubscribe">"#) && html.contains("List-Unsubscribe"),
        "{html}"
    );
    let again = send(&app, &promo, &json!({"data": {"contact": {"email": "una@example.com"}}}), None).await;
    assert_eq!(again.status, 200, "still subscribed after the GET: {:?}", again.body);

    // RFC 8058: a POST with the one-click body, as a mail client sends it.
    let first = public(&app, reqwest::Method::POST, &path, Some("List-Unsubscribe=One-Click")).await;
    assert_eq!(first.status(), 200);
    let token = first.headers()["consistency-token"].to_str().expect("a token").to_owned();
    let first: Value = first.json().await.expect("JSON");
    assert_eq!(first["data"]["unsubscribed"], true);
    assert_eq!(first["data"]["scope"], "marketing");
    let records = app.request(reqwest::Method::GET, "/schemas/people/records", Some(MAIL_KEY));
    let contact = app.send(records.header("Consistency-Token", token)).await.body["data"][0].clone();
    assert_eq!(contact["newsConsent"], false, "{contact}");
    let refused = send(&app, &promo, &json!({"data": {"contact": {"email": "una@example.com"}}}), None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_not_subscribed")));
    // Idempotent, with an empty body too.
    let second = public(&app, reqwest::Method::POST, &path, None).await;
    assert_eq!(second.status(), 200);
    let events = app.query_i64(&format!("SELECT count(*) FROM events WHERE stream_id = 'email-{email_id}'")).await;
    assert_eq!(events, 3, "scheduled, sent, unsubscribed once");
    // The consent change is in the contact's audit trail.
    let id = contact["id"].as_str().expect("id");
    let trail = app.get(&format!("/schemas/people/records/{id}/audit-trail"), MAIL_KEY).await;
    assert_conforms("AuditTrailEntry", trail.body["data"].as_array().expect("entries"));
    assert!(
        trail.body["data"]
            .as_array()
            .expect("entries")
            .iter()
            .any(|entry| entry["type"] == "consent_changed" && entry["value"] == false),
        "{:?}",
        trail.body
    );

    for method in [reqwest::Method::GET, reqwest::Method::POST] {
        let unknown = public(&app, method, "/emails/em_unknown/unsubscribe", None).await;
        assert_eq!(unknown.status(), 404);
        let body: Value = unknown.json().await.expect("JSON");
        assert_eq!(body["error"]["code"], "email_not_found");
    }
}

#[tokio::test]
async fn preferences_change_topics_and_consent_for_api_clients_and_refuse_what_is_not_a_choice() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let submitted = app
        .send(app.request(reqwest::Method::POST, &format!("/forms/{QUICK_FORM}/submit"), None).json(&json!({
            "email": "pat@example.com", "firstName": "Pat"
        })))
        .await;
    assert_eq!(submitted.status, 200, "{:?}", submitted.body);
    let newsletter = template_id(&app, "newsletter").await;
    let sent = send(&app, &newsletter, &json!({"data": {"contact": {"email": "pat@example.com"}}}), None).await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    let email_id = sent.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let topics = app.get("/topics", MAIL_KEY).await;
    let topic = topics.body["data"][0]["id"].as_str().expect("the news topic").to_owned();
    let path = format!("/emails/{email_id}/preferences");
    let change = |body: Value| {
        let request = app.request(reqwest::Method::POST, &path, None).json(&body);
        app.send(request)
    };

    // Leaving the topic: JSON for an API client, every topic of the space with its status.
    let left = change(json!({"topics": {&topic: "unsubscribed"}})).await;
    assert_eq!(left.status, 200, "{:?}", left.body);
    assert_eq!(
        left.body["data"],
        json!({"emailId": email_id, "unsubscribedFromAll": false, "topics": {&topic: "unsubscribed"}})
    );
    let token = left.header("consistency-token").expect("a change is a write").to_owned();
    // Leaving the email's topic on its page is an opt-out through the email, as the link's is.
    let story = app
        .send(
            app.request(reqwest::Method::GET, &format!("/emails/{email_id}"), Some(MAIL_KEY))
                .header("Consistency-Token", token),
        )
        .await;
    assert_eq!(story.body["data"]["unsubscribed"], true, "{:?}", story.body);
    let opt_outs = || app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EmailUnsubscribed.v1'");
    assert_eq!(opt_outs().await, 1);
    let body = json!({"data": {"contact": {"email": "pat@example.com"}}});
    let refused = send(&app, &newsletter, &body, None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_not_subscribed")));
    // The same choice again changes nothing.
    let events = || app.query_i64("SELECT count(*) FROM events WHERE event_type LIKE 'SubscriptionChanged%'");
    let before = events().await;
    let again = change(json!({"topics": {&topic: "unsubscribed"}})).await;
    assert_eq!((again.status, again.header("consistency-token")), (200, None));
    assert_eq!(events().await, before);
    // Subscribing again sends again; leaving everything withdraws the consent too.
    let back = change(json!({"topics": {&topic: "subscribed"}})).await;
    assert_eq!(back.body["data"]["topics"][&topic], "subscribed", "{:?}", back.body);
    assert_eq!(send(&app, &newsletter, &body, None).await.status, 200);
    let all = change(json!({"unsubscribeAll": true})).await;
    assert_eq!((all.status, &all.body["data"]["unsubscribedFromAll"]), (200, &json!(true)), "{:?}", all.body);
    let token = all.header("consistency-token").expect("a token").to_owned();
    let records = app.request(reqwest::Method::GET, "/schemas/people/records", Some(MAIL_KEY));
    let contact = app.send(records.header("Consistency-Token", token)).await.body["data"][0].clone();
    assert_eq!(contact["newsConsent"], false, "{contact}");
    let trail = app
        .get(
            &format!("/schemas/people/records/{}/audit-trail?channel=email", contact["id"].as_str().expect("id")),
            MAIL_KEY,
        )
        .await;
    let sources: Vec<&Value> =
        trail.body["data"].as_array().expect("entries").iter().map(|entry| &entry["source"]).collect();
    assert_eq!(sources.iter().filter(|source| **source == "preferences").count(), 3, "{:?}", trail.body);
    assert_eq!(opt_outs().await, 1, "leaving everything through an email that was left already counts once");
    // Every consent change says what carried it (newest first): the page of the email, and
    // before it the form that created the contact.
    let carriers: Vec<&Value> = trail.body["data"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|entry| entry["type"] == "consent_changed")
        .map(|entry| &entry["source"])
        .collect();
    assert_eq!(
        carriers,
        [&json!({"type": "preferences", "id": email_id}), &json!({"type": "form", "id": QUICK_FORM})],
        "{:?}",
        trail.body
    );
    assert_eq!(contact["source"], "form", "a contact a form created says so");

    // What is not a choice is refused, naming the field; nothing is written.
    let before = events().await;
    for (body, field) in [
        (json!({}), "topics"),
        (json!({"topics": {&topic: "maybe"}}), "topics."),
        (json!({"topics": {"top_unknown": "subscribed"}}), "topics.top_unknown"),
        (json!({"topics": {&topic: "subscribed"}, "unsubscribeAll": true}), "topics"),
        (json!({"colour": "red"}), "colour"),
    ] {
        let response = change(body.clone()).await;
        assert_eq!(
            (response.status, response.code().as_str()),
            (400, Some("invalid_preferences")),
            "{body}: {:?}",
            response.body
        );
        let issues = response.body["error"]["issues"].as_array().expect("issues");
        assert!(
            issues.iter().any(|issue| issue["key"].as_str().is_some_and(|key| key.starts_with(field))),
            "{body}: {issues:?}"
        );
    }
    assert_eq!(events().await, before);
    let unknown = app
        .send(
            app.request(reqwest::Method::POST, "/emails/em_unknown/preferences", None)
                .json(&json!({"unsubscribeAll": true})),
        )
        .await;
    assert_eq!((unknown.status, unknown.code().as_str()), (404, Some("email_not_found")));
    // A form body of another type names both accepted ones.
    let plain = app
        .send(
            app.request(reqwest::Method::POST, &format!("/forms/{QUICK_FORM}/submit"), None)
                .header("Content-Type", "text/plain")
                .body("email=x"),
        )
        .await;
    assert_eq!(plain.status, 415, "{:?}", plain.body);
    let message = plain.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("application/x-www-form-urlencoded") && message.contains("application/json"), "{message}");
}

#[tokio::test]
async fn email_events_reach_email_event_webhooks_filtered_by_type() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let receiver = email_webhook(&app, &["scheduled", "sent", "unsubscribed"]).await;
    let promo = template_id(&app, "promo").await;
    let sent =
        send(&app, &promo, &json!({"data": {"contact": {"email": "hook@example.com", "newsConsent": true}}}), None)
            .await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    let email_id = sent.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    // A failed send is not asked for: it must not arrive.
    sink.set_mode(json!({"mode": "reject", "code": 550})).await;
    let failed = send(&app, &promo, &json!({"data": {"contact": {"email": "hook@example.com"}}}), None).await;
    assert_eq!(failed.body["data"]["status"], "failed", "{:?}", failed.body);
    let unsubscribed = public(&app, reqwest::Method::POST, &format!("/emails/{email_id}/unsubscribe"), None).await;
    assert_eq!(unsubscribed.status(), 200);
    // Another recipient leaves everything on the email's preference page: the same event.
    sink.set_mode(json!({"mode": "accept"})).await;
    let third =
        send(&app, &promo, &json!({"data": {"contact": {"email": "page@example.com", "newsConsent": true}}}), None)
            .await;
    assert_eq!(third.body["data"]["status"], "sent", "{:?}", third.body);
    let third_id = third.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let left = app
        .send(
            app.request(reqwest::Method::POST, &format!("/emails/{third_id}/preferences"), None)
                .json(&json!({"unsubscribeAll": true})),
        )
        .await;
    assert_eq!(left.status, 200, "{:?}", left.body);
    // scheduled + sent + unsubscribed of the first and third emails, scheduled of the second.
    receiver.wait_for("mail", 7, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let received = receiver.received("mail").await;
    let mut types: Vec<String> =
        received.iter().filter_map(|delivery| delivery["body"]["type"].as_str().map(str::to_owned)).collect();
    types.sort();
    assert_eq!(
        types,
        [
            "email.scheduled",
            "email.scheduled",
            "email.scheduled",
            "email.sent",
            "email.sent",
            "email.unsubscribed",
            "email.unsubscribed"
        ]
    );
    let page_opt_out = received
        .iter()
        .find(|d| d["body"]["type"] == "email.unsubscribed" && d["body"]["data"]["emailId"] == json!(third_id));
    assert!(page_opt_out.is_some(), "the page's opt-out is announced: {received:?}");
    assert!(received.iter().all(|delivery| delivery["verifiedWith"] == json!([0])), "signed: {received:?}");
    let sent_delivery = received.iter().find(|d| d["body"]["type"] == "email.sent").expect("email.sent");
    assert_eq!(sent_delivery["body"]["data"]["emailId"], email_id);
    assert_eq!(sent_delivery["body"]["data"]["templateId"], promo);
    assert_eq!(sent_delivery["body"]["data"]["messageId"], format!("<{email_id}@mail.example.test>"));
}

/// A receiver with an endpoint `mail` that an `email event` webhook of the mail space delivers
/// `types` to, with the webhook's secret registered (so each delivery's signature is checked).
pub(crate) async fn email_webhook(app: &TestApp, types: &[&str]) -> crate::receiver::Receiver {
    let receiver = crate::receiver::Receiver::start().await;
    receiver.endpoint("mail", &[], json!({})).await;
    let created = app
        .post(
            "/webhooks",
            MAIL_KEY,
            &json!({"url": receiver.url("mail"), "trigger": "email event", "emailEventTypes": types}),
        )
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let secret = created.body["data"]["signatureVerificationSecret"].as_str().expect("secret").to_owned();
    receiver.endpoint("mail", &[&secret], json!({})).await;
    receiver
}

/// A form post as a browser sends it (urlencoded), from `client` through a trusted proxy.
async fn post_form(app: &TestApp, form_id: &str, body: &str, client: Option<&str>) -> TestResponse {
    let mut request = app
        .request(reqwest::Method::POST, &format!("/forms/{form_id}/submit"), None)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(body.to_owned());
    if let Some(client) = client {
        request = request.header("X-Forwarded-For", client);
    }
    let response = request.send().await.expect("the request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("the body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    TestResponse { status, headers, body }
}

async fn post_form_json(app: &TestApp, form_id: &str, body: &Value, client: Option<&str>) -> TestResponse {
    let mut request = app.request(reqwest::Method::POST, &format!("/forms/{form_id}/submit"), None).json(body);
    if let Some(client) = client {
        request = request.header("X-Forwarded-For", client);
    }
    app.send(request).await
}

fn trusting_loopback(settings: &mut platform::settings::Settings) {
    settings.http.trusted_proxies = vec!["127.0.0.1".parse().expect("an address")];
}

/// The path (under `/v1`) of the confirmation link in a message's text part.
pub(crate) fn confirmation_path(message: &Value) -> String {
    let text = message["text"].as_str().expect("a text part");
    let url = text.split_whitespace().find(|word| word.contains("/confirm/")).expect("a confirmation link");
    url.split("/v1").nth(1).expect("under the public base URL").to_owned()
}

#[tokio::test]
async fn a_live_apply_that_changes_a_kept_template_does_not_stop_form_submissions() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    // The first submission keeps the confirmation template in the process's cache.
    let first = post_form_json(&app, SIGNUP_FORM, &json!({"email_address": "one@example.com"}), None).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    sink.wait_for(1, WAIT).await;
    // The operator changes that template while the system runs.
    let mut workspace: Value = serde_json::from_str(&mail_workspace(100)).expect("JSON");
    let mail = workspace["spaces"].as_array_mut().expect("spaces").iter_mut().find(|space| space["slug"] == "mail");
    let templates = mail.expect("the mail space")["templates"].as_array_mut().expect("templates");
    let confirm = templates.iter_mut().find(|template| template["slug"] == "confirm").expect("confirm");
    confirm["subject"] = json!("Please confirm: {{ form.name }}");
    app.apply_workspace(&workspace.to_string(), true).await;
    // The next submission reads the form at the new revision and meets the kept template of
    // the old one: it drops it and uses the new one, not 409 after three attempts.
    let second = post_form_json(&app, SIGNUP_FORM, &json!({"email_address": "two@example.com"}), None).await;
    assert_eq!(second.status, 200, "{:?}", second.body);
    let messages = sink.wait_for(2, WAIT).await;
    let second = messages.iter().find(|message| message["rcptTo"] == json!(["two@example.com"])).expect("sent");
    assert_eq!(second["headers"]["subject"][0], "Please confirm: Newsletter signup");
}

#[tokio::test]
async fn a_form_is_found_through_the_api_and_submitted_by_its_id() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    // The read permission lists the space's forms by slug, each with its id and public URLs.
    let list = app.get("/forms", MAIL_READER).await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    let forms = list.body["data"].as_array().expect("forms");
    let slugs: Vec<&str> = forms.iter().filter_map(|form| form["slug"].as_str()).collect();
    assert_eq!(slugs, ["closed", "quick", "signup"]);
    assert_eq!(list.body["pagination"]["totalCount"], 3);
    let signup = forms.iter().find(|form| form["slug"] == "signup").expect("signup");
    assert_eq!(signup["id"], SIGNUP_FORM);
    assert_eq!(signup["submitUrl"], format!("https://api.example.test/v1/forms/{SIGNUP_FORM}/submit"));
    assert_eq!(signup["confirmUrl"], format!("https://api.example.test/v1/forms/{SIGNUP_FORM}/confirm/{{token}}"));
    assert_eq!((&signup["doubleOptIn"], &signup["enabled"]), (&json!(true), &json!(true)));
    assert_eq!(signup["fields"], json!({"email_address": "email", "first_name": "firstName"}));
    let closed = forms.iter().find(|form| form["slug"] == "closed").expect("closed");
    assert_eq!((&closed["enabled"], &closed["confirmUrl"]), (&json!(false), &Value::Null));
    let one = app.get(&format!("/forms/{SIGNUP_FORM}"), MAIL_READER).await;
    assert_eq!((one.status, &one.body["data"]), (200, signup), "{:?}", one.body);
    // Another space's key does not see it.
    let elsewhere = app.get(&format!("/forms/{SIGNUP_FORM}"), ALPHA_MEMBER).await;
    assert_eq!((elsewhere.status, elsewhere.code().as_str()), (404, Some("form_not_found")), "{:?}", elsewhere.body);
    let none = app.get("/forms", ALPHA_MEMBER).await;
    assert_eq!(none.body["data"], json!([]), "{:?}", none.body);
    // The public submit takes the id, and says so to a caller that sends the slug.
    let by_slug = post_form_json(&app, "signup", &json!({"email_address": "eve@example.com"}), None).await;
    assert_eq!((by_slug.status, by_slug.code().as_str()), (404, Some("form_not_found")));
    let message = by_slug.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("not its slug") && message.contains("GET /forms"), "{message}");
    // Submitted at the URL the API gave, the confirmation mail links to its confirmUrl.
    let path = signup["submitUrl"].as_str().and_then(|url| url.split("/v1").nth(1)).expect("a path").to_owned();
    let submitted = app
        .send(app.request(reqwest::Method::POST, &path, None).json(&json!({"email_address": "eve@example.com"})))
        .await;
    assert_eq!(submitted.status, 200, "{:?}", submitted.body);
    let messages = sink.wait_for(1, WAIT).await;
    let link = confirmation_path(&messages[0]);
    let prefix = signup["confirmUrl"].as_str().and_then(|url| url.split("/v1").nth(1)).expect("a path");
    assert!(link.starts_with(prefix.trim_end_matches("{token}")), "{link} is not {prefix}");
}

#[tokio::test]
async fn double_opt_in_end_to_end_with_a_browser_post_and_the_link_followed_twice() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let newsletter = template_id(&app, "newsletter").await;
    let submitted =
        post_form(&app, SIGNUP_FORM, "email_address=Dee%40Example.com&first_name=Dee&submit=Go", None).await;
    assert_eq!(submitted.status, 200, "{:?}", submitted.body);
    assert!(submitted.header("content-type").is_some_and(|t| t.starts_with("text/html")));
    assert!(submitted.body.as_str().is_some_and(|html| html.contains("check your inbox")));
    let messages = sink.wait_for(1, WAIT).await;
    let confirmation = &messages[0];
    assert_eq!(confirmation["rcptTo"], json!(["dee@example.com"]));
    assert_eq!(confirmation["headers"]["subject"][0], "Confirm your subscription to Newsletter signup");
    assert_eq!(confirmation["dkim"]["valid"], true);
    let link = confirmation_path(confirmation);
    assert!(link.starts_with(&format!("/forms/{SIGNUP_FORM}/confirm/")), "{link}");
    let token = link.rsplit('/').next().expect("the token");
    assert_eq!(token.len(), 43, "32 random bytes");
    let stored = app.query_i64(&format!("SELECT count(*) FROM form_tokens WHERE token_digest = '{token}'")).await;
    assert_eq!(stored, 0, "only a digest of the token is stored");
    let in_log = app
        .query_i64(&format!("SELECT count(*) FROM events WHERE position(convert_to('{token}', 'UTF8') in payload) > 0"))
        .await;
    assert_eq!(in_log, 0, "the token is not in the log in the clear");

    // Pending: marketing on the topic is refused until the link is followed.
    let body = json!({"data": {"contact": {"email": "dee@example.com"}}});
    let refused = send(&app, &newsletter, &body, None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_not_subscribed")));

    for _ in 0..2 {
        let page = app.send(app.request(reqwest::Method::GET, &link, None)).await;
        assert_eq!(page.status, 200, "a second confirmation is a success too (D7)");
    }
    let json_confirm =
        app.send(app.request(reqwest::Method::GET, &link, None).header("Accept", "application/json")).await;
    assert_eq!(json_confirm.body["data"]["status"], "confirmed");
    let sent = send(&app, &newsletter, &body, None).await;
    assert_eq!(sent.status, 200, "subscribed and consented after confirming: {:?}", sent.body);
    assert_eq!(sent.body["data"]["status"], "sent");
    let email_id = sent.body["data"]["emailId"].as_str().expect("emailId").to_owned();

    // One-click unsubscribe from a topic email leaves the topic.
    let left = public(
        &app,
        reqwest::Method::POST,
        &format!("/emails/{email_id}/unsubscribe"),
        Some("List-Unsubscribe=One-Click"),
    )
    .await;
    let token = left.headers()["consistency-token"].to_str().expect("a token").to_owned();
    let left: Value = left.json().await.expect("JSON");
    assert_eq!(left["data"]["scope"], "topic");
    // The contact's audit trail tells the story on channel email.
    let records = app.request(reqwest::Method::GET, "/schemas/people/records", Some(MAIL_KEY));
    let contact_id = app.send(records.header("Consistency-Token", &token)).await.body["data"][0]["id"].clone();
    let trail = app
        .get(
            &format!("/schemas/people/records/{}/audit-trail?channel=email", contact_id.as_str().expect("id")),
            MAIL_KEY,
        )
        .await;
    assert_conforms("AuditTrailEntry", trail.body["data"].as_array().expect("entries"));
    let mut kinds: Vec<String> = trail.body["data"]
        .as_array()
        .expect("entries")
        .iter()
        .rev()
        .map(|entry| {
            format!(
                "{}{}",
                entry["type"].as_str().unwrap_or(""),
                entry["status"].as_str().map(|s| format!(":{s}")).unwrap_or_default()
            )
        })
        .collect();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "subscription_changed:pending",
            "email_scheduled",
            "form_submitted",
            "email_sent",
            "consent_changed",
            "subscription_changed:subscribed",
            "subscription_confirmed",
            "email_scheduled",
            "email_sent",
            "subscription_changed:unsubscribed",
            "email_unsubscribed",
        ],
        "{:?}",
        trail.body
    );
    let refused = send(&app, &newsletter, &body, None).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_not_subscribed")));

    // The link of another form, or a made-up token, is not found: JSON for a client that asks
    // for it, a page otherwise (what a browser opens).
    let json_only = |path: String| app.request(reqwest::Method::GET, &path, None).header("Accept", "application/json");
    let other = app.send(json_only(format!("/forms/{QUICK_FORM}/confirm/{token}"))).await;
    assert_eq!((other.status, other.code().clone()), (404, json!("confirmation_not_found")));
    let made_up = app.send(json_only(format!("/forms/{SIGNUP_FORM}/confirm/nope"))).await;
    assert_eq!((made_up.status, made_up.code().clone()), (404, json!("confirmation_not_found")));
    let page = app.send(app.request(reqwest::Method::GET, &format!("/forms/{SIGNUP_FORM}/confirm/nope"), None)).await;
    assert_eq!((page.status, page.header("content-type")), (404, Some("text/html; charset=utf-8")));
    assert!(page.header("content-security-policy").is_some_and(|policy| policy.starts_with("default-src 'none'")));
}

#[tokio::test]
async fn a_json_submission_without_double_opt_in_subscribes_at_once_and_bad_submissions_are_refused() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let newsletter = template_id(&app, "newsletter").await;
    let submitted =
        post_form_json(&app, QUICK_FORM, &json!({"email": "eve@example.com", "firstName": "Eve"}), None).await;
    assert_eq!(submitted.status, 200, "{:?}", submitted.body);
    assert_eq!(submitted.body["data"]["status"], "subscribed");
    assert!(submitted.body["data"]["submissionId"].as_str().is_some_and(|id| id.starts_with("sub_")));
    let sent = send(&app, &newsletter, &json!({"data": {"contact": {"email": "eve@example.com"}}}), None).await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    sink.wait_for(1, WAIT).await;
    assert_eq!(sink.messages().await.len(), 1, "no confirmation email without double opt-in");

    let unknown = post_form_json(&app, "frm_unknown", &json!({"email": "x@example.com"}), None).await;
    assert_eq!((unknown.status, unknown.code().clone()), (404, json!("form_not_found")));
    let closed = post_form_json(&app, CLOSED_FORM, &json!({"email": "x@example.com"}), None).await;
    assert_eq!((closed.status, closed.code().clone()), (403, json!("form_disabled")));
    // A browser's post without an email: a page with the status, naming the form's field.
    let no_email = post_form(&app, SIGNUP_FORM, "first_name=Nobody", None).await;
    assert_eq!((no_email.status, no_email.header("content-type")), (400, Some("text/html; charset=utf-8")));
    let page = no_email.body.as_str().unwrap_or_default();
    assert!(page.contains("<strong>email_address</strong>: An email address is required."), "{page}");
    // The same without an email, as JSON: the envelope.
    let no_email = post_form_json(&app, SIGNUP_FORM, &json!({"first_name": "Nobody"}), None).await;
    assert_eq!(
        (no_email.status, no_email.code().clone()),
        (400, json!("invalid_form_submission")),
        "{:?}",
        no_email.body
    );
    let bad_email = post_form_json(&app, QUICK_FORM, &json!({"email": "not an address"}), None).await;
    assert_eq!(bad_email.status, 400, "{:?}", bad_email.body);
}

#[tokio::test]
async fn a_confirmation_to_a_suppressed_address_is_not_sent_and_its_story_says_why() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "sue@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    let submitted = post_form_json(&app, SIGNUP_FORM, &json!({"email_address": "sue@example.com"}), None).await;
    assert_eq!(submitted.status, 200, "{:?}", submitted.body);
    assert_eq!(submitted.body["data"]["status"], "pending_confirmation", "the submission itself is kept");
    // A second address through the same form is mailed, so the sink has seen the first by then.
    let other = post_form_json(&app, SIGNUP_FORM, &json!({"email_address": "sam@example.com"}), None).await;
    assert_eq!(other.status, 200, "{:?}", other.body);
    let messages = sink.wait_for(1, WAIT).await;
    assert_eq!(messages[0]["rcptTo"], json!(["sam@example.com"]), "no confirmation to the suppressed address");
    let email_id =
        app.query_string("SELECT substr(stream_id, 7) FROM events WHERE event_type = 'EmailSkipped.v1'").await;
    app.wait_for_projections().await;
    let story = app.get(&format!("/emails/{email_id}"), MAIL_KEY).await;
    assert_eq!(story.status, 200, "{:?}", story.body);
    assert_eq!(story.body["data"]["status"], "skipped");
    assert_eq!(story.body["data"]["origin"], json!({"type": "form_confirmation", "formId": SIGNUP_FORM}));
    let refusal = &story.body["data"]["timeline"][0];
    assert_eq!(refusal["gate"], "suppressed", "{refusal}");
    assert_eq!(refusal["decidedBy"]["type"], "SuppressionAdded", "{refusal}");
}

#[tokio::test]
async fn each_form_limiter_answers_429_with_retry_after() {
    let sink = SmtpSink::start().await;
    let options = Options {
        email: Some(test_email(&sink)),
        // Long windows, so that no window ends during the test; the contract's lengths are
        // the defaults (a unit test of the settings holds them).
        tweak: Some(|settings| {
            trusting_loopback(settings);
            settings.forms.confirmations_per_form = 4;
            settings.forms.window_seconds = 86_400;
            settings.forms.confirmation_window_seconds = 86_400;
        }),
        ..Options::default()
    };
    let app = TestApp::spawn_with(options).await;
    app.apply_workspace(&mail_workspace(1000), true).await;
    // Per client address (through the trusted proxy): 10 per window.
    for index in 0..10 {
        let ok =
            post_form_json(&app, QUICK_FORM, &json!({"email": format!("ip{index}@example.com")}), Some("203.0.113.7"))
                .await;
        assert_eq!(ok.status, 200, "{:?}", ok.body);
    }
    let limited = post_form_json(&app, QUICK_FORM, &json!({"email": "ip10@example.com"}), Some("203.0.113.7")).await;
    assert_eq!((limited.status, limited.code().clone()), (429, json!("rate_limit_exceeded")));
    assert!(limited.header("retry-after").is_some_and(|date| httpdate::parse_http_date(date).is_ok()));
    // Another address is not limited by that one.
    let other = post_form_json(&app, QUICK_FORM, &json!({"email": "ip11@example.com"}), Some("203.0.113.8")).await;
    assert_eq!(other.status, 200);
    // Confirmation emails: 2 per recipient per form.
    for attempt in 0..2 {
        let ok = post_form_json(
            &app,
            SIGNUP_FORM,
            &json!({"email_address": "twice@example.com"}),
            Some(&format!("198.51.100.{attempt}")),
        )
        .await;
        assert_eq!(ok.status, 200, "{:?}", ok.body);
    }
    let third =
        post_form_json(&app, SIGNUP_FORM, &json!({"email_address": "twice@example.com"}), Some("198.51.100.9")).await;
    assert_eq!((third.status, third.code().clone()), (429, json!("rate_limit_exceeded")), "{:?}", third.body);
    // Confirmation emails per form (4 here): two more recipients fill it.
    for index in 0..2 {
        let ok = post_form_json(
            &app,
            SIGNUP_FORM,
            &json!({"email_address": format!("c{index}@example.com")}),
            Some(&format!("192.0.2.{index}")),
        )
        .await;
        assert_eq!(ok.status, 200, "{:?}", ok.body);
    }
    let full = post_form_json(&app, SIGNUP_FORM, &json!({"email_address": "c9@example.com"}), Some("192.0.2.9")).await;
    assert_eq!((full.status, full.code().clone()), (429, json!("rate_limit_exceeded")));
    sink.wait_for(4, WAIT).await;
    // Per form: 120 per window, whatever the addresses.
    let mut statuses = Vec::new();
    for index in 0..130 {
        let response = post_form_json(
            &app,
            QUICK_FORM,
            &json!({"email": format!("f{index}@example.com")}),
            Some(&format!("10.1.{}.{}", index / 200, index % 200)),
        )
        .await;
        statuses.push(response.status);
    }
    // 11 submissions to this form were counted above (the one refused for its address was
    // refused before the form's count); 109 more fit.
    assert_eq!(statuses.iter().filter(|status| **status == 200).count(), 109, "{statuses:?}");
    assert!(statuses.iter().all(|status| *status == 200 || *status == 429));
}

#[tokio::test]
async fn forwarded_for_from_an_untrusted_peer_does_not_escape_the_address_limiter() {
    let sink = SmtpSink::start().await;
    let options = Options {
        email: Some(test_email(&sink)),
        tweak: Some(|settings| settings.forms.window_seconds = 86_400),
        ..Options::default()
    };
    let app = TestApp::spawn_with(options).await;
    app.apply_workspace(&mail_workspace(100), true).await;
    let mut statuses = Vec::new();
    for index in 0..11 {
        let spoofed = format!("203.0.113.{index}");
        let response =
            post_form_json(&app, QUICK_FORM, &json!({"email": format!("s{index}@example.com")}), Some(&spoofed)).await;
        statuses.push(response.status);
    }
    assert_eq!(statuses[..10], [200; 10]);
    assert_eq!(statuses[10], 429);
}

#[tokio::test]
async fn an_expired_confirmation_link_is_gone() {
    let sink = SmtpSink::start().await;
    let options = Options {
        email: Some(test_email(&sink)),
        tweak: Some(|settings| settings.forms.token_ttl_hours = 0),
        ..Options::default()
    };
    let app = TestApp::spawn_with(options).await;
    app.apply_workspace(&mail_workspace(100), true).await;
    let domains = app.get("/domains", MAIL_KEY).await;
    let dkim = &domains.body["data"][0]["records"][1];
    sink.add_dkim_record(dkim["name"].as_str().expect("name"), dkim["value"].as_str().expect("value")).await;
    let submitted = post_form_json(&app, SIGNUP_FORM, &json!({"email_address": "late@example.com"}), None).await;
    assert_eq!(submitted.status, 200, "{:?}", submitted.body);
    let messages = sink.wait_for(1, WAIT).await;
    let link = confirmation_path(&messages[0]);
    let gone = app.send(app.request(reqwest::Method::GET, &link, None).header("Accept", "application/json")).await;
    assert_eq!((gone.status, gone.code().clone()), (410, json!("confirmation_expired")));
    // In a browser, a page that says so, with the same status.
    let page = app.send(app.request(reqwest::Method::GET, &link, None).header("Accept", "text/html")).await;
    assert_eq!((page.status, page.header("content-type")), (410, Some("text/html; charset=utf-8")));
}

#[tokio::test]
async fn deleting_a_contact_that_was_sent_mail_leaves_nothing_of_it_in_the_database() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let tag = uuid::Uuid::now_v7().simple().to_string();
    let (address, name) = (format!("gone-{tag}@example.org"), format!("Quintessa{}", &tag[24..]));
    // Email event webhooks whose payloads about the contact are queued (the target refuses
    // connections).
    let hook = app
        .post(
            "/webhooks",
            MAIL_KEY,
            &json!({"url": "http://127.0.0.1:9/hook", "trigger": "email event", "emailEventTypes": ["scheduled", "sent", "failed"]}),
        )
        .await;
    assert_eq!(hook.status, 201, "{:?}", hook.body);
    let receipt = template_id(&app, "receipt").await;
    let sent = send(&app, &receipt, &receipt_body(&address, &name), Some(&format!("gone-{tag}"))).await;
    assert_eq!(sent.body["data"]["status"], "sent", "{:?}", sent.body);
    // A relay whose refusal quotes the address. (Not a refused mailbox: a hard bounce's
    // suppression keeps the address by design, to keep blocking it after the contact goes.)
    sink.set_mode(json!({"mode": "reject", "code": 554, "message": format!("refused for {address}")})).await;
    let failed = send(&app, &receipt, &receipt_body(&address, &name), None).await;
    assert_eq!(failed.body["data"]["status"], "failed", "{:?}", failed.body);
    assert!(!failed.body.to_string().contains(&address), "the answer does not quote the address: {:?}", failed.body);
    sink.wait_for(1, WAIT).await;
    let contact_id =
        app.get("/schemas/people/records", MAIL_KEY).await.body["data"][0]["id"].as_str().expect("id").to_owned();
    let deadline = std::time::Instant::now() + WAIT;
    while app.query_i64(&format!("SELECT count(*) FROM webhook_deliveries WHERE subject_id = '{contact_id}'")).await < 4
    {
        assert!(std::time::Instant::now() < deadline, "the email event deliveries were not enqueued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = crate::erasure::dump(&app).await;
    assert!(!crate::erasure::occurrences(&before, &address).is_empty(), "the read model holds the address before");
    assert!(crate::erasure::occurrences(&before, "paid 42.5").is_empty(), "rendered bodies are never in the clear");

    let deleted = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/people/records/{contact_id}"), Some(MAIL_KEY)))
        .await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    let operation_id = deleted.body["data"]["operationId"].as_str().expect("operationId").to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let polled = app.get(&format!("/record-deletions/{operation_id}"), MAIL_KEY).await;
        if polled.body["data"]["status"] == "completed" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the deletion did not complete: {:?}", polled.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = crate::erasure::dump(&app).await;
    for needle in [address.as_str(), name.as_str()] {
        let found = crate::erasure::occurrences(&after, needle);
        assert!(found.is_empty(), "{needle:?} is still in the database: {found:?}");
    }
}

#[tokio::test]
async fn without_a_relay_messages_are_written_as_eml_files() {
    let sink = SmtpSink::start().await;
    let dir = std::env::temp_dir().join(format!("eml-test-{}", uuid::Uuid::now_v7().simple()));
    let email =
        platform::settings::EmailSettings { relay_url: None, eml_dir: dir.display().to_string(), ..test_email(&sink) };
    let app = mail_app_with(&sink, 100, email).await;
    let receipt = template_id(&app, "receipt").await;
    let sent = send(&app, &receipt, &receipt_body("file@example.com", "File"), None).await;
    assert_eq!(sent.body["data"]["status"], "sent", "{:?}", sent.body);
    let email_id = sent.body["data"]["emailId"].as_str().expect("emailId");
    let written = std::fs::read_to_string(dir.join(format!("{email_id}.eml"))).expect("the .eml file");
    // The envelope sender a relay would get (`mailFrom` in the transactional test), first, as
    // final delivery writes it.
    assert!(
        written.starts_with(&format!("Return-Path: <bounce+{email_id}@bounces.mail.example.test>\r\nDKIM-Signature: ")),
        "{written}"
    );
    assert_eq!(written.matches("Return-Path:").count(), 1, "{written}");
    assert!(written.contains("DKIM-Signature: "), "{written}");
    assert!(written.contains(&format!("Message-ID: <{email_id}@mail.example.test>")), "{written}");
    assert!(sink.messages().await.is_empty(), "nothing went to a relay");
    // The story says where it went without the server's path.
    let story = story_when(&app, email_id, "sent").await;
    let sent = story["timeline"].as_array().and_then(|t| t.iter().find(|e| e["type"] == "sent")).cloned();
    let reply = sent.map(|entry| entry["relayReply"].clone()).unwrap_or_default();
    assert_eq!(reply, json!(format!("written as {email_id}.eml in the .eml folder")), "{story}");
    assert!(!story.to_string().contains(&dir.display().to_string()), "no server path: {story}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_relay_url_carries_auth_credentials() {
    let sink = SmtpSink::start().await;
    let email = platform::settings::EmailSettings {
        relay_url: Some(format!("smtp://mailer:s3cret@127.0.0.1:{}", sink.smtp_port()).into()),
        ..test_email(&sink)
    };
    let app = mail_app_with(&sink, 100, email).await;
    let receipt = template_id(&app, "receipt").await;
    let sent = send(&app, &receipt, &receipt_body("auth@example.com", "Auth"), None).await;
    assert_eq!(sent.body["data"]["status"], "sent", "{:?}", sent.body);
    let messages = sink.wait_for(1, WAIT).await;
    assert_eq!(messages[0]["authLogin"], "mailer", "{:?}", messages[0]);
    assert_eq!(messages[0]["pipelined"], true, "the sink offers PIPELINING: one write for MAIL, RCPT and DATA");
}

#[tokio::test]
async fn a_send_after_the_template_changed_renders_the_new_one_though_the_old_was_kept() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let receipt = template_id(&app, "receipt").await;
    // The first send keeps the template, its sender and domain in the command service.
    let first = send(&app, &receipt, &receipt_body("kept1@example.com", "Ada"), None).await;
    assert_eq!(first.body["data"]["status"], "sent", "{:?}", first.body);
    let changed = mail_workspace(100).replace("Order {{ order.externalId }} for", "Receipt {{ order.externalId }} for");
    app.apply_workspace(&changed, true).await;
    // Decided on the kept template, the append meets the catalog's new revision: the send is
    // decided again on what the catalog holds now.
    let second = send(&app, &receipt, &receipt_body("kept2@example.com", "Bea"), None).await;
    assert_eq!(second.body["data"]["status"], "sent", "{:?}", second.body);
    let messages = sink.wait_for(2, WAIT).await;
    let subject = |to: &str| {
        messages
            .iter()
            .find(|message| message["rcptTo"][0] == to)
            .and_then(|message| message["headers"]["subject"][0].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(subject("kept1@example.com"), "Order ord-1 for Ada");
    assert_eq!(subject("kept2@example.com"), "Receipt ord-1 for Bea");
}

/// Quiet hours around now in the policy's zone, with `outcome`: from the start of the last
/// hour to two hours after the start of this one. Now is inside them and their end is at least
/// an hour away, so a test that runs near the end of an hour does not see the clock release
/// what it holds. Returns the window and its end (in UTC where the zone is UTC).
pub(crate) fn quiet_hours_around_now(outcome: &str) -> (Value, chrono::DateTime<chrono::Utc>) {
    let now = chrono::Utc::now();
    let hour = chrono::Timelike::hour(&now);
    let this_hour = chrono::DurationRound::duration_trunc(now, chrono::TimeDelta::hours(1)).expect("in range");
    let window = json!({"from": format!("{:02}:00", (hour + 23) % 24), "to": format!("{:02}:00", (hour + 2) % 24),
                        "outcome": outcome});
    (window, this_hour + chrono::TimeDelta::hours(2))
}

/// The mail workspace with a `timeZone` attribute on people and `policy` as the space's send
/// policy.
pub(crate) fn policy_workspace(policy: &Value) -> String {
    policy_workspace_with(1000, policy)
}

/// [`policy_workspace`] with a monthly allowance of `allowance` emails.
pub(crate) fn policy_workspace_with(allowance: i64, policy: &Value) -> String {
    let mut workspace: Value = serde_json::from_str(&mail_workspace(allowance)).expect("JSON");
    let spaces = workspace["spaces"].as_array_mut().expect("spaces");
    let space = spaces.iter_mut().find(|space| space["slug"] == "mail").expect("the mail space");
    space["schemas"][0]["attributes"]
        .as_array_mut()
        .expect("attributes")
        .push(json!({"key": "timeZone", "definition": {"type": "timezone"}}));
    space["sendPolicy"] = policy.clone();
    workspace.to_string()
}

#[tokio::test]
async fn a_send_policy_caps_and_quiets_marketing_in_the_contacts_zone_and_lets_transactional_mail_through() {
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options { email: Some(test_email(&sink)), ..Options::default() }).await;
    // Quiet around now in UTC; a zone twelve hours ahead is mid-day.
    let (quiet, _) = quiet_hours_around_now("skip");
    let policy = json!({
        "timeZone": {"attribute": "timeZone", "default": "UTC"},
        "quietHours": quiet,
        "frequencyCaps": [{"max": 1, "per": {"hours": 24}, "outcome": "skip"}]
    });
    app.apply_workspace(&policy_workspace(&policy), true).await;
    publish_dkim(&app, &sink).await;
    let promo = template_id(&app, "promo").await;
    let contact =
        |email: &str, zone: &str| json!({"data": {"contact": {"email": email, "newsConsent": true, "timeZone": zone}}});

    // Quiet in UTC (the zone given in any letter case, and the default for a contact without
    // one); not in a zone twelve hours ahead.
    let none = json!({"data": {"contact": {"email": "none@example.com", "newsConsent": true}}});
    for (body, zone) in
        [(contact("utc@example.com", "UTC"), "UTC"), (none, "none"), (contact("low@example.com", "utc"), "utc")]
    {
        let quiet = send(&app, &promo, &body, None).await;
        assert_eq!((quiet.status, quiet.code().as_str()), (422, Some("quiet_hours")), "{zone}: {:?}", quiet.body);
        // The refusal names the rule and when a send would be allowed.
        assert_eq!(quiet.body["error"]["issues"][0]["key"], "sendPolicy.quietHours", "{:?}", quiet.body);
        assert!(quiet.body["error"]["notBefore"].is_string(), "{:?}", quiet.body);
    }
    // A value that is no time zone is refused where it is written, never read as the default.
    for zone in ["Mars/Olympus", "+05:30"] {
        let refused = send(&app, &promo, &contact("mars@example.com", zone), None).await;
        assert_eq!(refused.status, 400, "{zone}: {:?}", refused.body);
        let issue = &refused.body["error"]["issues"][0];
        assert_eq!(
            (issue["key"].as_str(), issue["code"].as_str()),
            (Some("timeZone"), Some("invalid_attribute_value"))
        );
        assert!(issue["message"].as_str().is_some_and(|m| m.contains("IANA time zone")), "{:?}", refused.body);
    }
    let stored = app
        .post("/schemas/people/records", MAIL_KEY, &json!({"email": "kol@example.com", "timeZone": "asia/kolkata"}))
        .await;
    assert_eq!(stored.status, 201, "{:?}", stored.body);
    assert_eq!(stored.body["data"]["timeZone"], "Asia/Kolkata", "stored as the zone spells it: {:?}", stored.body);
    let ahead = send(&app, &promo, &contact("ahead@example.com", "Etc/GMT-12"), None).await;
    assert_eq!(ahead.status, 200, "{:?}", ahead.body);
    assert_eq!(ahead.body["data"]["status"], "sent", "{:?}", ahead.body);
    // One marketing email a day: the second is capped; transactional mail is exempt from both.
    let capped = send(&app, &promo, &contact("ahead@example.com", "Etc/GMT-12"), None).await;
    assert_eq!((capped.status, capped.code().as_str()), (422, Some("frequency_capped")), "{:?}", capped.body);
    assert_eq!(capped.body["error"]["issues"][0]["key"], "sendPolicy.frequencyCaps[0]", "{:?}", capped.body);
    let receipt = template_id(&app, "receipt").await;
    let mut body = receipt_body("ahead@example.com", "Ada");
    body["data"]["contact"]["timeZone"] = json!("UTC");
    let transactional = send(&app, &receipt, &body, None).await;
    assert_eq!(transactional.status, 200, "{:?}", transactional.body);
    assert_eq!(transactional.body["data"]["status"], "sent", "{:?}", transactional.body);
    assert_eq!(sink.wait_for(2, WAIT).await.len(), 2);

    // Applied live: without the policy, both go.
    let workspace: Value = serde_json::from_str(&policy_workspace(&json!(null))).expect("JSON");
    let mut workspace = workspace;
    let spaces = workspace["spaces"].as_array_mut().expect("spaces");
    let space = spaces.iter_mut().find(|space| space["slug"] == "mail").expect("the mail space");
    space.as_object_mut().expect("an object").remove("sendPolicy");
    app.apply_workspace(&workspace.to_string(), true).await;
    let again = send(&app, &promo, &contact("ahead@example.com", "UTC"), None).await;
    assert_eq!(again.status, 200, "the policy is gone: {:?}", again.body);
}

#[tokio::test]
async fn two_marketing_sends_to_one_contact_at_the_same_moment_cannot_both_pass_a_cap_of_one() {
    // Each contact is sent the promo twice at once: both decisions read no send today, but
    // only the first append takes the contact's next place; the other decides again and is
    // capped.
    const PEOPLE: usize = 20;
    let sink = SmtpSink::start().await;
    // Forty sends at once on a loaded machine: an inline hand-off may start later than the
    // tests' usual grace of a second, and the outbox worker then takes the email and the send
    // answers that its outcome is unknown (as it should). This test is about the cap, so the
    // worker waits longer, and so does the relay's exchange.
    let email = platform::settings::EmailSettings { handoff_grace_ms: 60_000, timeout_ms: 10_000, ..test_email(&sink) };
    let app = TestApp::spawn_with(Options { email: Some(email), ..Options::default() }).await;
    let policy = json!({
        "timeZone": {"attribute": "timeZone", "default": "UTC"},
        "frequencyCaps": [{"max": 1, "per": {"hours": 24}, "outcome": "skip"}]
    });
    app.apply_workspace(&policy_workspace(&policy), true).await;
    publish_dkim(&app, &sink).await;
    let promo = template_id(&app, "promo").await;
    let mut contacts = Vec::new();
    for index in 0..PEOPLE {
        let made = app
            .post(
                "/schemas/people/records",
                MAIL_KEY,
                &json!({"email": format!("twice{index}@example.com"), "newsConsent": true}),
            )
            .await;
        assert_eq!(made.status, 201, "{:?}", made.body);
        contacts.push(made.body["data"]["id"].as_str().expect("id").to_owned());
    }
    let bodies: Vec<Value> = contacts.iter().map(|id| json!({"data": {"contact": {"id": id}}})).collect();
    let answers = futures_util::future::join_all(
        bodies.iter().flat_map(|body| [send(&app, &promo, body, None), send(&app, &promo, body, None)]),
    )
    .await;
    for (index, pair) in answers.chunks(2).enumerate() {
        let mut outcomes: Vec<(u16, String)> =
            pair.iter().map(|answer| (answer.status, answer.code().as_str().unwrap_or("sent").to_owned())).collect();
        outcomes.sort();
        assert_eq!(
            outcomes,
            vec![(200, "sent".to_owned()), (422, "frequency_capped".to_owned())],
            "contact {index}: {:?}",
            pair.iter().map(|answer| &answer.body).collect::<Vec<_>>()
        );
    }
    assert_eq!(sink.wait_for(PEOPLE, WAIT).await.len(), PEOPLE);
    let recorded = app.query_i64("SELECT count(*) FROM marketing_sends").await;
    assert_eq!(recorded, PEOPLE as i64, "one counted send per contact");
}

#[tokio::test]
async fn a_contact_made_through_the_api_joins_a_topic_in_its_write_and_gets_its_first_marketing_mail() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let newsletter = template_id(&app, "newsletter").await;
    let to = |id: &str| json!({"data": {"contact": {"id": id}}});

    // Consent alone: the newsletter's topic still refuses it.
    let dev =
        app.post("/schemas/people/records", MAIL_KEY, &json!({"email": "dev@example.com", "newsConsent": true})).await;
    assert_eq!(dev.status, 201, "{:?}", dev.body);
    let dev = dev.body["data"]["id"].as_str().expect("id").to_owned();
    let refused = send(&app, &newsletter, &to(&dev), None).await;
    assert_eq!((refused.status, refused.code().as_str()), (422, Some("recipient_not_subscribed")));

    // The same write with its topic (by slug): the first marketing send goes.
    let request = app.request(reqwest::Method::PATCH, &format!("/schemas/people/records/{dev}"), Some(MAIL_KEY));
    let joined = app.send(request.json(&json!({"topics": ["news"]}))).await;
    assert_eq!(joined.status, 200, "{:?}", joined.body);
    assert!(joined.body["data"].get("topics").is_none(), "topics are no attribute of the record: {:?}", joined.body);
    let sent = send(&app, &newsletter, &to(&dev), None).await;
    assert_eq!((sent.status, sent.body["data"]["status"].as_str()), (200, Some("sent")), "{:?}", sent.body);
    assert_eq!(sink.wait_for(1, WAIT).await[0]["rcptTo"][0], "dev@example.com");

    // Created with consent and its topic (by name) in one request: reachable at once.
    let ada = app
        .post(
            "/schemas/people/records",
            MAIL_KEY,
            &json!({"email": "ada@example.com", "newsConsent": true, "topics": ["News"]}),
        )
        .await;
    assert_eq!(ada.status, 201, "{:?}", ada.body);
    let ada = ada.body["data"]["id"].as_str().expect("id").to_owned();
    // A template is named by its id or, as here, its slug.
    assert_eq!(send(&app, "newsletter", &to(&ada), None).await.status, 200);

    // The provenance: an API write, by its operation, in the audit trail.
    app.wait_for_projections().await;
    let trail = app.get(&format!("/schemas/people/records/{ada}/audit-trail"), MAIL_KEY).await;
    let entries = trail.body["data"].as_array().cloned().unwrap_or_default();
    let subscribed = entries.iter().find(|entry| entry["type"] == "subscription_changed").expect("a subscription");
    assert_eq!((&subscribed["status"], &subscribed["source"]), (&json!("subscribed"), &json!("api")), "{subscribed}");
    assert!(subscribed["sourceId"].as_str().is_some_and(|id| id.starts_with("op_")), "{subscribed}");

    // Left through an upsert's object form: the newsletter is refused again.
    let left = app
        .post(
            "/schemas/people/records/upsert",
            MAIL_KEY,
            &json!({"email": "ada@example.com", "topics": {"news": "unsubscribed"}}),
        )
        .await;
    assert_eq!(left.status, 200, "{:?}", left.body);
    let refused = send(&app, &newsletter, &to(&ada), None).await;
    assert_eq!((refused.status, refused.code().as_str()), (422, Some("recipient_not_subscribed")));

    // An unknown topic refuses the whole write, naming it; nothing is stored.
    let unknown = app
        .post("/schemas/people/records", MAIL_KEY, &json!({"email": "nope@example.com", "topics": ["news", "nope"]}))
        .await;
    assert_eq!((unknown.status, unknown.code().as_str()), (400, Some("invalid_field")), "{:?}", unknown.body);
    let issue = &unknown.body["error"]["issues"][0];
    assert_eq!((issue["key"].as_str(), issue["code"].as_str()), (Some("topics.nope"), Some("topic_not_found")));
    let listed = app.get("/schemas/people/records?email=nope@example.com", MAIL_KEY).await;
    assert_eq!(listed.body["data"], json!([]), "{:?}", listed.body);
}

/// Makes held email `email_id` due now, as if its time had come.
pub(crate) async fn make_due(app: &TestApp, email_id: &str) {
    let client = app.pool.get().await.expect("client");
    let moved = client
        .execute("UPDATE email_outbox SET next_attempt_at = now() WHERE email_id = $1 AND state = 'held'", &[&email_id])
        .await
        .expect("moved");
    assert_eq!(moved, 1, "email {email_id} is held");
}

/// The story of email `email_id` once its status is `status`.
pub(crate) async fn story_when(app: &TestApp, email_id: &str, status: &str) -> Value {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        app.wait_for_projections().await;
        let story = app.get(&format!("/emails/{email_id}"), MAIL_KEY).await;
        assert_eq!(story.status, 200, "{:?}", story.body);
        if story.body["data"]["status"] == status {
            return story.body["data"].clone();
        }
        assert!(std::time::Instant::now() < deadline, "email {email_id} never became {status}: {:?}", story.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_held_send_waits_for_its_time_is_decided_again_then_and_is_sent_once_or_skipped_with_its_story() {
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options { email: Some(test_email(&sink)), ..Options::default() }).await;
    // Quiet around now in UTC: held until the window ends.
    let now = chrono::Utc::now();
    let (quiet, end) = quiet_hours_around_now("hold");
    let policy = json!({
        "timeZone": {"attribute": "timeZone", "default": "UTC"},
        "quietHours": quiet,
        "frequencyCaps": [{"max": 1, "per": {"hours": 2}, "outcome": "hold"}]
    });
    app.apply_workspace(&policy_workspace(&policy), true).await;
    publish_dkim(&app, &sink).await;
    let promo = template_id(&app, "promo").await;
    let contact =
        |email: &str, zone: &str| json!({"data": {"contact": {"email": email, "newsConsent": true, "timeZone": zone}}});
    let window_end = end.format("%Y-%m-%dT%H:00:00.000Z").to_string();

    let held = send(&app, &promo, &contact("night@example.com", "UTC"), None).await;
    assert_eq!(held.status, 200, "{:?}", held.body);
    assert_eq!(
        (held.body["data"]["status"].as_str(), held.body["data"]["notBefore"].as_str()),
        (Some("held"), Some(window_end.as_str())),
        "{:?}",
        held.body
    );
    let email_id = held.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let story = story_when(&app, &email_id, "held").await;
    assert_eq!(story["notBefore"].as_str(), Some(window_end.as_str()), "{story}");
    assert_eq!(story["timeline"][1]["gate"], "quiet_hours", "{story}");
    let contact_id = story["contactId"].as_str().expect("contactId").to_owned();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sink.messages().await.is_empty(), "nothing leaves before its time");

    // Its time comes while it is still night where the contact is: held again.
    make_due(&app, &email_id).await;
    let deadline = std::time::Instant::now() + WAIT;
    while app.query_i64(&format!("SELECT count(*) FROM events WHERE stream_id = 'email-{email_id}'")).await < 3 {
        assert!(std::time::Instant::now() < deadline, "never decided again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let story = story_when(&app, &email_id, "held").await;
    assert_eq!(story["timeline"].as_array().map(Vec::len), Some(3), "held once more: {story}");

    // The contact moved to where it is day: decided again with that, it is sent, once.
    let moved = app
        .send(
            app.request(reqwest::Method::PATCH, &format!("/schemas/people/records/{contact_id}"), Some(MAIL_KEY))
                .json(&json!({"timeZone": "Etc/GMT-12"})),
        )
        .await;
    assert_eq!(moved.status, 200, "{:?}", moved.body);
    app.wait_for_projections().await;
    // Two seconds on, so that a message dated at its scheduling would show it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    make_due(&app, &email_id).await;
    let story = story_when(&app, &email_id, "sent").await;
    let kinds: Vec<&str> =
        story["timeline"].as_array().expect("a timeline").iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds, ["scheduled", "held", "held", "released", "sent"], "{story}");
    assert_eq!(story["notBefore"], Value::Null);
    let messages = sink.wait_for(1, WAIT).await;
    assert_eq!(messages[0]["rcptTo"][0], "night@example.com");
    // Its message is dated at its release, not at its scheduling.
    let instant = |text: &str| chrono::DateTime::parse_from_rfc3339(text).expect("a time").timestamp();
    let released_at = instant(story["timeline"][3]["at"].as_str().expect("released at"));
    let date = messages[0]["headers"]["date"][0].as_str().expect("a Date header");
    let dated = chrono::DateTime::parse_from_rfc2822(date).expect("an RFC 5322 date").timestamp();
    assert!((dated - released_at).abs() <= 1, "{date} is its release, {}", story["timeline"][3]["at"]);
    assert!(dated - instant(story["timeline"][0]["at"].as_str().expect("scheduled at")) >= 2, "{date}");

    // Released, it counts against the cap: the next marketing send to the contact is held
    // until the released one leaves the two-hour window.
    let capped = send(&app, &promo, &contact("night@example.com", "Etc/GMT-12"), None).await;
    assert_eq!(capped.body["data"]["status"], "held", "{:?}", capped.body);
    assert_eq!(capped.body["data"]["gate"], "frequency_cap", "{:?}", capped.body);
    let not_before = capped.body["data"]["notBefore"].as_str().expect("notBefore");
    let until = chrono::DateTime::parse_from_rfc3339(not_before).expect("a time").with_timezone(&chrono::Utc);
    let expected = now + chrono::Duration::hours(2);
    assert!((until - expected).num_seconds().abs() < 60, "{until} is two hours after the release ({expected})");

    // Suppressed meanwhile: at its time it is skipped with its story, never mailed.
    let capped_id = capped.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "night@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    app.wait_for_projections().await;
    make_due(&app, &capped_id).await;
    let story = story_when(&app, &capped_id, "skipped").await;
    let last = story["timeline"].as_array().and_then(|timeline| timeline.last()).cloned().unwrap_or_default();
    assert_eq!(
        (last["gate"].as_str(), last["error"]["code"].as_str()),
        (Some("suppressed"), Some("recipient_suppressed"))
    );
    assert!(last["decidedBy"]["position"].as_i64().is_some(), "the suppression decided: {last}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.messages().await.len(), 1, "the skipped one is never mailed");
    let states = app.query_string(&format!("SELECT state FROM email_outbox WHERE email_id = '{capped_id}'")).await;
    assert_eq!(states, "skipped");
}

#[tokio::test]
async fn a_held_send_to_a_contact_deleted_meanwhile_is_dropped_with_its_contact_and_never_mailed() {
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options { email: Some(test_email(&sink)), ..Options::default() }).await;
    let (quiet, _) = quiet_hours_around_now("hold");
    let policy = json!({"timeZone": {"attribute": "timeZone", "default": "UTC"}, "quietHours": quiet});
    app.apply_workspace(&policy_workspace(&policy), true).await;
    publish_dkim(&app, &sink).await;
    let promo = template_id(&app, "promo").await;
    let body = json!({"data": {"contact": {"email": "gone@example.com", "newsConsent": true, "timeZone": "UTC"}}});
    let held = send(&app, &promo, &body, None).await;
    assert_eq!(held.body["data"]["status"], "held", "{:?}", held.body);
    let email_id = held.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let contact_id = story_when(&app, &email_id, "held").await["contactId"].as_str().expect("contactId").to_owned();
    let deleted = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/people/records/{contact_id}"), Some(MAIL_KEY)))
        .await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    let operation_id = deleted.body["data"]["operationId"].as_str().expect("operationId").to_owned();
    let deadline = std::time::Instant::now() + WAIT;
    while app.get(&format!("/record-deletions/{operation_id}"), MAIL_KEY).await.body["data"]["status"] != "completed" {
        assert!(std::time::Instant::now() < deadline, "the deletion did not complete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    make_due(&app, &email_id).await;
    let deadline = std::time::Instant::now() + WAIT;
    while app.query_string(&format!("SELECT state FROM email_outbox WHERE email_id = '{email_id}'")).await != "skipped"
    {
        assert!(std::time::Instant::now() < deadline, "the held send was not decided again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.wait_for_projections().await;
    let gone = app.get(&format!("/emails/{email_id}"), MAIL_KEY).await;
    assert_eq!(
        (gone.status, gone.code().as_str()),
        (404, Some("email_not_found")),
        "no story comes back: {:?}",
        gone.body
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sink.messages().await.is_empty(), "never mailed");
}

#[tokio::test]
async fn a_send_policy_that_cannot_hold_is_refused_at_apply_naming_the_problem() {
    let app = TestApp::spawn_with(Options::default()).await;
    for (policy, problem) in [
        (json!({"timeZone": {"default": "Mars/Olympus"}}), "not an IANA time zone name"),
        (json!({"timeZone": {"default": "UTC", "attribute": "shoeSize"}}), "not an attribute of a contact schema"),
        (json!({"timeZone": {"default": "UTC", "attribute": "firstName"}}), "declare it {\"type\": \"timezone\"}"),
        (
            json!({"timeZone": {"default": "UTC"}, "quietHours": {"from": "25:00", "to": "08:00", "outcome": "skip"}}),
            "HH:MM",
        ),
        (
            json!({"timeZone": {"default": "UTC"}, "frequencyCaps": [{"max": 0, "per": {"hours": 1}, "outcome": "skip"}]}),
            "at least 1",
        ),
        (
            json!({"timeZone": {"default": "UTC"}, "frequencyCaps": [{"max": 1, "per": {"hours": 1, "days": 1}, "outcome": "skip"}]}),
            "per is",
        ),
        (
            json!({"timeZone": {"default": "UTC"}, "frequencyCaps": [{"max": 1, "per": {"days": 1}, "topic": "nope", "outcome": "skip"}]}),
            "topic \"nope\"",
        ),
        (
            json!({"timeZone": {"default": "UTC"}, "frequencyCaps": vec![json!({"max": 1, "per": {"days": 1}, "outcome": "skip"}); 11]}),
            "at most 10",
        ),
    ] {
        let workspace = command_service::authoring::parse(&policy_workspace(&policy)).expect("parses");
        let refused = command_service::authoring::plan(&app.pool, &workspace, Default::default()).await.err();
        let message = refused.map(|error| format!("{error:#}")).unwrap_or_default();
        assert!(message.contains(problem), "{policy}: {message}");
    }
}

#[tokio::test]
async fn marketing_mail_without_a_postal_address_is_refused_at_apply_and_the_spaces_address_serves_its_senders() {
    let app = TestApp::spawn_with(Options::default()).await;
    let without = |space_address: Option<&str>| {
        let mut workspace: Value = serde_json::from_str(&mail_workspace(100)).expect("JSON");
        let spaces = workspace["spaces"].as_array_mut().expect("spaces");
        let space = spaces.iter_mut().find(|space| space["slug"] == "mail").expect("the mail space");
        space["senders"][0].as_object_mut().expect("a sender").remove("postalAddress");
        if let Some(address) = space_address {
            space["postalAddress"] = json!(address);
        }
        command_service::authoring::parse(&workspace.to_string()).expect("parses")
    };
    let refused = command_service::authoring::plan(&app.pool, &without(None), Default::default()).await.err();
    let message = refused.map(|error| format!("{error:#}")).unwrap_or_default();
    assert!(message.contains("postal address") && message.contains("\"hello\""), "{message}");
    assert!(
        command_service::authoring::plan(
            &app.pool,
            &without(Some("Mail Ltd, 2 High Street, York")),
            Default::default()
        )
        .await
        .is_ok()
    );
    let short = command_service::authoring::plan(&app.pool, &without(Some("x")), Default::default()).await.err();
    assert!(short.is_some_and(|error| format!("{error:#}").contains("5 to 300 characters")));
}

/// A hand-off rebuilds its emails from the log: their events, their contacts' data keys, each
/// sender and domain, every read by key. PostgreSQL planned those reads again on every call
/// (with a held release's read models' batches and appends, a quarter of its time in the
/// database); they now run their generic plans, planned once per connection. Counted by
/// `pg_stat_statements`, over eight rebuilds on one connection.
#[tokio::test]
async fn a_hand_offs_reads_of_the_log_are_planned_once_per_connection() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let receipt = template_id(&app, "receipt").await;
    let mut email_ids = Vec::new();
    for index in 0..3 {
        let sent = send(&app, &receipt, &receipt_body(&format!("planned{index}@example.com"), "Ada"), None).await;
        assert_eq!(sent.body["data"]["status"], "sent", "{:?}", sent.body);
        email_ids.push(sent.body["data"]["emailId"].as_str().expect("emailId").to_owned());
    }
    // The rebuilds connect as a role of their own, so that the counts are theirs alone (the
    // services' processes run the same statements as `postgres`).
    let database = app.query_string("SELECT current_database()").await;
    let role = format!("counted_{database}");
    app.pool
        .get()
        .await
        .expect("a connection")
        .batch_execute(&format!(
            "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; CREATE ROLE {role} LOGIN; GRANT postgres TO {role};"
        ))
        .await
        .expect("the statements' counts and their role");
    let url = format!("{} user={role}", app.database_url);
    // The statistics are the whole cluster's, shared with every other test's database: when
    // they are full, PostgreSQL evicts the least used entries, and an entry evicted between
    // its statement's planning and its execution comes back counting calls but no plans. A
    // measurement during which anything was evicted is taken again, on a new connection.
    let evicted = "SELECT dealloc FROM pg_stat_statements_info";
    for attempt in 1..=5 {
        let before = app.query_i64(evicted).await;
        app.query_string(&format!(
            "SELECT pg_stat_statements_reset((SELECT oid FROM pg_roles WHERE rolname = '{role}'))::text"
        ))
        .await;
        let pool = platform::db::pool(&url, 1).expect("a pool");
        let mut client = pool.get().await.expect("a connection");
        for _ in 0..8 {
            let prepared = mail::outbox::prepare_many_from_log(&mut client, &email_ids, "https://api.example.test/v1")
                .await
                .expect("rebuilt");
            assert_eq!(prepared.iter().filter(|prepared| prepared.is_ok()).count(), 3);
        }
        let counted = app
            .query_strings(&format!(
                "SELECT calls || ' ' || plans || ' ' || left(regexp_replace(query, '\\s+', ' ', 'g'), 60)
                 FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
                 WHERE r.rolname = '{role}' AND (query LIKE '%AND event_type IN%' OR query LIKE '%FROM subject_keys%'
                       OR query LIKE '%ORDER BY stream_version DESC LIMIT%')"
            ))
            .await;
        if app.query_i64(evicted).await != before && attempt < 5 {
            continue;
        }
        // The events, the keys, and the sender's and the domain's definitions (one statement).
        assert_eq!(counted.len(), 3, "{counted:?}");
        for statement in &counted {
            let (calls, plans) = match statement.split(' ').collect::<Vec<_>>()[..] {
                [calls, plans, ..] => (calls.parse::<i64>().expect("calls"), plans.parse::<i64>().expect("plans")),
                _ => panic!("{statement}"),
            };
            assert!(calls >= 8 && plans == 1, "planned once over {calls} calls: {statement}");
        }
        return;
    }
}
