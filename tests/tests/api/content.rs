//! Content for every market: templates with variants by locale, partials and layouts from the
//! workspace file, each mail in its reader's language (read back by Python's own MIME parser
//! in the SMTP sink), what `apply` refuses, and the preview.

use std::time::Duration;

use serde_json::{Value, json};

use crate::broadcasts::finished_run;
use crate::email::{MAIL_KEY, QUICK_FORM, WEEKLY_BROADCAST, mail_workspace, publish_dkim, test_email};
use crate::helpers::*;
use crate::smtp_sink::{SmtpSink, raw_bytes};

const WAIT: Duration = Duration::from_secs(30);

/// The mail space with a locale attribute, a greeting partial in three languages, a brand
/// layout that restyles the marketing footer, and the weekly newsletter in English (the
/// default), German, Japanese and Arabic, from a sender whose name is not ASCII.
fn content_workspace(change: impl FnOnce(&mut Value)) -> String {
    let mut workspace: Value = serde_json::from_str(&mail_workspace(1000)).expect("the workspace is JSON");
    let space = workspace["spaces"]
        .as_array_mut()
        .and_then(|spaces| spaces.iter_mut().find(|space| space["slug"] == "mail"))
        .expect("the mail space");
    space["schemas"][0]["attributes"]
        .as_array_mut()
        .expect("attributes")
        .push(json!({"key": "language", "definition": {"type": "string"}}));
    space["senders"][0]["fromName"] = json!("Équipe Exemple");
    space["locale"] = json!({"attribute": "language", "default": "en"});
    space["partials"] = json!([
        {"slug": "greeting", "html": "<p class=\"greeting\">Hello {{ name }},</p>", "text": "Hello {{ name }},",
         "locales": {
             "de": {"html": "<p class=\"greeting\">Hallo {{ name }},</p>", "text": "Hallo {{ name }},"},
             "ja": {"html": "<p class=\"greeting\">{{ name }}さん、こんにちは。</p>", "text": "{{ name }}さん、こんにちは。"},
             "ar": {"html": "<p class=\"greeting\">مرحبا {{ name }}،</p>", "text": "مرحبا {{ name }}،"}
         }},
        {"slug": "signature", "html": "<p>{% render 'team' %}</p>", "text": "{% render 'team' %}"},
        {"slug": "team", "html": "The Example team"}
    ]);
    space["layouts"] = json!([
        {"slug": "brand",
         "html": "<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body><div class=\"brand\">{{ content }}</div>\
                  <p class=\"footer\">{{ postalAddress }} · <a href=\"{{ unsubscribeUrl }}\">Unsubscribe</a></p></body></html>",
         "text": "{{ content }}\n\n-- \n{{ postalAddress }}\nUnsubscribe: {{ unsubscribeUrl }}",
         "locales": {
             "de": {"html": "<html><body><div class=\"brand\">{{ content }}</div><p class=\"footer\">{{ postalAddress }} · \
                             <a href=\"{{ unsubscribeUrl }}\">Abmelden</a></p></body></html>",
                    "text": "{{ content }}\n\n-- \n{{ postalAddress }}\nAbmelden: {{ unsubscribeUrl }}"}
         }}
    ]);
    let newsletter = space["templates"]
        .as_array_mut()
        .and_then(|templates| templates.iter_mut().find(|template| template["slug"] == "newsletter"))
        .expect("the newsletter");
    *newsletter = json!({
        "slug": "newsletter", "name": "Newsletter", "kind": "marketing", "sender": "hello", "topic": "news",
        "layout": "brand", "locale": "en",
        "subject": "News for {{ contact.firstName }}",
        "html": "{% render 'greeting', name: contact.firstName %}<p>This week's news.</p>{% render 'signature' %}",
        "text": "{% render 'greeting', name: contact.firstName %}\n\nThis week's news.\n{% render 'signature' %}",
        "data": {"contact": {"schema": "people"}},
        "locales": {
            "de": {"subject": "Neuigkeiten für {{ contact.firstName }}: Grüße!",
                   "html": "{% render 'greeting', name: contact.firstName %}<p>Die Neuigkeiten der Woche.</p>",
                   "text": "{% render 'greeting', name: contact.firstName %}\n\nDie Neuigkeiten der Woche."},
            "ja": {"subject": "{{ contact.firstName }}さんへの今週のニュース",
                   "html": "{% render 'greeting', name: contact.firstName %}<p>今週のニュースです。</p>",
                   "text": "{% render 'greeting', name: contact.firstName %}\n\n今週のニュースです。"},
            "ar": {"subject": "أخبار الأسبوع لـ {{ contact.firstName }}",
                   "html": "{% render 'greeting', name: contact.firstName %}<p>أخبار هذا الأسبوع.</p>",
                   "text": "{% render 'greeting', name: contact.firstName %}\n\nأخبار هذا الأسبوع."}
        }
    });
    change(space);
    workspace.to_string()
}

async fn content_app(sink: &SmtpSink) -> TestApp {
    let app = TestApp::spawn_with(Options { email: Some(test_email(sink)), ..Options::default() }).await;
    app.apply_workspace(&content_workspace(|_| {}), true).await;
    publish_dkim(&app, sink).await;
    app
}

/// A subscribed, consenting contact of the news topic with `language` (none when `None`);
/// its id.
async fn reader(app: &TestApp, email: &str, first_name: &str, language: Option<&str>) -> String {
    let submitted = app
        .send(
            app.request(reqwest::Method::POST, &format!("/forms/{QUICK_FORM}/submit"), None)
                .json(&json!({"email": email, "firstName": first_name})),
        )
        .await;
    assert!(submitted.status < 300, "{:?}", submitted.body);
    let upserted =
        app.post("/schemas/people/records/upsert", MAIL_KEY, &json!({"email": email, "language": language})).await;
    assert!(upserted.status < 300, "{:?}", upserted.body);
    upserted.body["data"]["id"].as_str().expect("the contact's id").to_owned()
}

fn header<'a>(message: &'a Value, name: &str) -> &'a str {
    message["headers"][name][0].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_broadcast_reaches_each_reader_in_their_language_and_each_mail_reads_right() {
    let sink = SmtpSink::start().await;
    let app = content_app(&sink).await;
    // (address, first name, locale attribute, the subject they read, the locale, how chosen,
    // the greeting, the direction)
    let readers = [
        (
            "de@example.com",
            "Jürgen",
            Some("de"),
            "Neuigkeiten für Jürgen: Grüße!",
            "de",
            "exact",
            "Hallo Jürgen,",
            "ltr",
        ),
        (
            "at@example.com",
            "Anna",
            Some("de_at"),
            "Neuigkeiten für Anna: Grüße!",
            "de",
            "language",
            "Hallo Anna,",
            "ltr",
        ),
        (
            "ja@example.com",
            "花子",
            Some("ja"),
            "花子さんへの今週のニュース",
            "ja",
            "exact",
            "花子さん、こんにちは。",
            "ltr",
        ),
        ("ar@example.com", "ليلى", Some("ar"), "أخبار الأسبوع لـ ليلى", "ar", "exact", "مرحبا ليلى،", "rtl"),
        ("none@example.com", "Ada", None, "News for Ada", "en", "default", "Hello Ada,", "ltr"),
        ("odd@example.com", "Bo", Some("not a tag"), "News for Bo", "en", "invalid", "Hello Bo,", "ltr"),
    ];
    for (email, name, language, ..) in readers {
        reader(&app, email, name, language).await;
    }
    app.wait_for_workers().await;
    let sent = app
        .send(
            app.request(reqwest::Method::POST, &format!("/broadcasts/{WEEKLY_BROADCAST}/send"), Some(MAIL_KEY))
                .header("Idempotency-Key", "weekly-languages"),
        )
        .await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    let run = finished_run(&app, WEEKLY_BROADCAST, &run_id, WAIT).await;
    assert_eq!(run["counts"]["sent"], readers.len(), "{run}");
    let messages = sink.wait_for(readers.len(), WAIT).await;
    app.wait_for_projections().await;
    for (email, _, _, subject, tag, source, greeting, dir) in readers {
        let message = messages
            .iter()
            .find(|message| message["rcptTo"][0] == email)
            .unwrap_or_else(|| panic!("no mail to {email}"));
        // Python's parser decodes the RFC 2047 words back to what the reader sees.
        assert_eq!(header(message, "subject"), subject, "{email}");
        assert_eq!(header(message, "from"), "Équipe Exemple <hello@mail.example.test>", "{email}");
        assert_eq!(header(message, "content-language"), tag, "{email}");
        assert_eq!(message["dkim"]["valid"], true, "{email}: {}", message["dkim"]);
        let raw = String::from_utf8_lossy(&raw_bytes(message)).to_string();
        let raw_subject = raw.lines().find(|line| line.starts_with("Subject:")).unwrap_or_default();
        let encoded = raw_subject.to_ascii_lowercase().contains("=?utf-8?");
        assert!(raw_subject.is_ascii() && (subject.is_ascii() || encoded), "{email}: RFC 2047 words: {raw_subject}");
        let html = message["html"].as_str().unwrap_or_default();
        let text = message["text"].as_str().unwrap_or_default();
        assert!(html.contains(&format!("<html lang=\"{tag}\" dir=\"{dir}\">")), "{email}: {html}");
        assert!(html.contains(greeting) && text.contains(greeting), "{email}: {html}\n{text}");
        // The layout's footer, in the layout's language, and no second footer from the platform.
        assert!(text.contains("Example Inc., 1 Main Street, Springfield, IL 62701"), "{email}: {text}");
        let word = if tag == "de" { "Abmelden: https://api.example.test/v1/emails/" } else { "Unsubscribe: https://" };
        assert!(text.contains(word), "{email}: {text}");
        assert!(!text.contains("You receive this because"), "{email}: the layout shows the footer: {text}");
        // The email's story names the locale, how it was chosen, and the parts' revisions.
        let email_id = message["messageId"]
            .as_str()
            .and_then(|id| id.trim_start_matches('<').split('@').next())
            .expect("the Message-ID names the email")
            .to_owned();
        let story = app.get(&format!("/emails/{email_id}"), MAIL_KEY).await;
        assert_eq!(story.status, 200, "{:?}", story.body);
        assert_eq!(story.body["data"]["locale"], json!({"tag": tag, "source": source}), "{email}");
        let parts: Vec<(String, String, i64)> = story.body["data"]["parts"]
            .as_array()
            .expect("parts")
            .iter()
            .map(|part| {
                let (kind, slug) =
                    (part["kind"].as_str().unwrap_or_default(), part["slug"].as_str().unwrap_or_default());
                (kind.to_owned(), slug.to_owned(), part["revision"].as_i64().unwrap_or_default())
            })
            .collect();
        let expected =
            [("layout", "brand", 1), ("partial", "greeting", 1), ("partial", "signature", 1), ("partial", "team", 1)];
        let expected: Vec<(String, String, i64)> =
            expected.iter().map(|(kind, slug, revision)| ((*kind).into(), (*slug).into(), *revision)).collect();
        assert_eq!(parts, expected, "{email}");
        assert_conforms("EmailStory", std::slice::from_ref(&story.body["data"]));
    }
    // The English default renders the partial that renders another partial.
    let english = messages.iter().find(|message| message["rcptTo"][0] == "none@example.com").expect("the English mail");
    assert!(english["text"].as_str().unwrap_or_default().contains("The Example team"), "{english}");
    // The delivery log's export carries the locale and the template's revision.
    let export = app
        .request(reqwest::Method::GET, &format!("/emails?broadcastRunId={run_id}"), Some(MAIL_KEY))
        .header("Accept", "text/csv")
        .send()
        .await
        .expect("answered");
    assert_eq!(export.status().as_u16(), 200);
    let csv = export.text().await.expect("a body");
    let header_row = csv.lines().next().unwrap_or_default();
    assert!(header_row.contains("templateId,templateRevision,locale,kind"), "{header_row}");
    assert!(csv.lines().any(|line| line.contains("ar@example.com") && line.contains(",ar,marketing,")), "{csv}");

    // A changed partial takes effect from the next send, which records its new revision.
    let changed = content_workspace(|space| {
        space["partials"][0]["locales"]["de"]["text"] = json!("Servus {{ name }},");
    });
    app.apply_workspace(&changed, true).await;
    sink.clear().await;
    let template = crate::email::template_id(&app, "newsletter").await;
    let again =
        crate::email::send(&app, &template, &json!({"data": {"contact": {"email": "de@example.com"}}}), None).await;
    assert_eq!((again.status, &again.body["data"]["status"]), (200, &json!("sent")), "{:?}", again.body);
    let message = &sink.wait_for(1, WAIT).await[0];
    assert!(message["text"].as_str().unwrap_or_default().starts_with("Servus Jürgen,"), "{message}");
    app.wait_for_projections().await;
    let email_id = again.body["data"]["emailId"].as_str().expect("emailId");
    let story = app.get(&format!("/emails/{email_id}"), MAIL_KEY).await;
    let greeting = story.body["data"]["parts"]
        .as_array()
        .and_then(|parts| parts.iter().find(|part| part["slug"] == "greeting"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(greeting["revision"], 2, "{:?}", story.body);
}

/// Applies `workspace` and answers why it was refused.
async fn refusal(app: &TestApp, workspace: &str) -> String {
    let parsed = command_service::authoring::parse(workspace).expect("the workspace parses");
    let log = platform::log::EventLog::start(app.pool.clone(), 16);
    let refused =
        command_service::authoring::apply(&app.pool, &log, &parsed, Default::default()).await.expect_err("refused");
    format!("{refused:#}")
}

fn newsletter(space: &mut Value) -> &mut Value {
    space["templates"]
        .as_array_mut()
        .and_then(|templates| templates.iter_mut().find(|template| template["slug"] == "newsletter"))
        .expect("the newsletter")
}

#[tokio::test]
async fn apply_refuses_content_that_would_not_render_naming_the_template_the_locale_and_the_line() {
    let app = TestApp::spawn().await;
    type Change = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(Change, &[&str])> = vec![
        (
            Box::new(|space| {
                newsletter(space)["locales"]["de"]["html"] = json!("<p>Hallo</p>\n{% render 'gruss' %}");
            }),
            &["template \"newsletter\", locale de, html line 2", "partial \"gruss\", which the space does not define"],
        ),
        (
            Box::new(|space| {
                newsletter(space)["locales"]["ja"]["text"] = json!("こんにちは\n\n{{ contact.nickname }}");
            }),
            &["template \"newsletter\", locale ja", "(line 3)", "nickname"],
        ),
        (
            Box::new(|space| newsletter(space)["locales"]["ja"]["subject"] = json!("{% if %}")),
            &["template \"newsletter\", locale ja, subject line 1"],
        ),
        (
            Box::new(|space| {
                newsletter(space)["html"] = json!("{% render partial_name %}");
            }),
            &["names its partial by a variable"],
        ),
        (
            Box::new(|space| space["partials"][2]["html"] = json!("{% render 'signature' %}")),
            &["partials render each other in a cycle: signature → team → signature"],
        ),
        (
            Box::new(|space| newsletter(space)["layout"] = json!("plain")),
            &["names layout \"plain\", which the space does not define"],
        ),
        (
            Box::new(|space| {
                space["layouts"][0]["locales"]["de"]["text"] = json!("{{ postalAddress }} {{ unsubscribeUrl }}")
            }),
            &["locale de: the text of its layout does not show the template's body ({{ content }})"],
        ),
        (
            Box::new(|space| {
                space["layouts"][0]["html"] =
                    json!("<html><body>{{ content }}<p>{{ postalAddress }}</p></body></html>");
            }),
            &["locale en: the html of its layout leaves out the marketing footer's {{ unsubscribeUrl }}"],
        ),
        (
            Box::new(|space| newsletter(space)["locales"]["xx-yy-zz"] = json!({"subject": "", "html": "", "text": ""})),
            &["\"xx-yy-zz\" is not a language tag"],
        ),
        (
            Box::new(|space| space["locale"] = json!({"attribute": "newsConsent", "default": "en"})),
            &["locale.attribute \"newsConsent\" is of type boolean"],
        ),
    ];
    for (change, expected) in cases {
        let why = refusal(&app, &content_workspace(change)).await;
        for part in expected {
            assert!(why.contains(part), "expected {part:?} in: {why}");
        }
    }
    // The same content, unchanged, applies.
    app.apply_workspace(&content_workspace(|_| {}), true).await;
}

async fn preview(app: &TestApp, template: &str, body: &Value) -> TestResponse {
    app.post(&format!("/templates/{template}/preview"), MAIL_KEY, body).await
}

#[tokio::test]
async fn a_preview_renders_what_a_send_would_for_a_contact_or_for_data_and_sends_nothing() {
    let sink = SmtpSink::start().await;
    let app = content_app(&sink).await;
    let jurgen = reader(&app, "de@example.com", "Jürgen", Some("de")).await;
    app.wait_for_workers().await;
    let german = preview(&app, "newsletter", &json!({"contactId": jurgen})).await;
    assert_eq!(german.status, 200, "{:?}", german.body);
    let data = &german.body["data"];
    assert_conforms("TemplatePreview", std::slice::from_ref(data));
    assert_eq!(data["subject"], "Neuigkeiten für Jürgen: Grüße!");
    assert_eq!(data["locale"], json!({"tag": "de", "source": "exact"}));
    assert!(data["html"].as_str().unwrap_or_default().starts_with("<html lang=\"de\" dir=\"ltr\">"), "{data}");
    assert!(
        data["text"]
            .as_str()
            .unwrap_or_default()
            .contains("Abmelden: https://api.example.test/v1/emails/preview/unsubscribe")
    );
    assert_eq!(data["parts"].as_array().map(Vec::len), Some(4), "{data}");
    // Links as written: no tracking link, no open pixel.
    assert!(!data["html"].as_str().unwrap_or_default().contains("/t/"), "{data}");
    // The body's locale replaces the contact's; data that is not stored renders too.
    let arabic = preview(&app, "newsletter", &json!({"contactId": jurgen, "locale": "ar-EG"})).await;
    assert_eq!(arabic.body["data"]["locale"], json!({"tag": "ar", "source": "language"}), "{:?}", arabic.body);
    assert!(arabic.body["data"]["html"].as_str().unwrap_or_default().contains("dir=\"rtl\""));
    let given =
        preview(&app, "newsletter", &json!({"data": {"contact": {"firstName": "Kim", "language": "ja"}}})).await;
    assert_eq!(given.status, 200, "{:?}", given.body);
    assert_eq!(given.body["data"]["subject"], "Kimさんへの今週のニュース");
    // Refusals, each with its code.
    let other_space = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": "x@example.com"})).await;
    let foreign = other_space.body["data"]["id"].as_str().unwrap_or("con_none").to_owned();
    for (body, status, code) in [
        (json!({"contactId": foreign}), 404, "record_not_found"),
        (json!({"contactId": "con_missing"}), 404, "record_not_found"),
        (json!({"locale": "english"}), 400, "invalid_field"),
        (json!({"subject": "mine"}), 400, "unknown_field"),
        (json!({}), 400, "invalid_template_data"),
        (json!({"contactId": jurgen, "data": {"contact": {"firstName": "X"}}}), 400, "invalid_template_data"),
    ] {
        let refused = preview(&app, "newsletter", &body).await;
        assert_eq!((refused.status, refused.code().clone()), (status, json!(code)), "{body}: {:?}", refused.body);
    }
    let broken = preview(&app, "broken", &json!({"data": {"contact": {"email": "b@example.com"}}})).await;
    assert_eq!((broken.status, broken.code().clone()), (422, json!("template_render_failed")), "{:?}", broken.body);
    let missing = preview(&app, "tpl_missing", &json!({})).await;
    assert_eq!(missing.code(), &json!("template_not_found"));
    // Nothing was sent, stored or counted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.messages().await.len(), 0);
    app.wait_for_projections().await;
    let log = app.get(&format!("/emails?contactId={jurgen}"), MAIL_KEY).await;
    assert_eq!(log.body["data"].as_array().map(Vec::len), Some(0), "{:?}", log.body);
}

#[tokio::test]
async fn a_test_send_is_one_real_message_marked_as_a_test_that_nothing_counts() {
    let sink = SmtpSink::start().await;
    let app = content_app(&sink).await;
    let jurgen = reader(&app, "de@example.com", "Jürgen", Some("de")).await;
    app.wait_for_workers().await;
    let test = |body: Value| {
        let app = &app;
        async move { app.post("/templates/newsletter/test", MAIL_KEY, &body).await }
    };
    let sent = test(json!({"to": "qa@team.example", "contactId": jurgen})).await;
    assert_eq!((sent.status, &sent.body["data"]["status"]), (200, &json!("sent")), "{:?}", sent.body);
    let email_id = sent.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let message = &sink.wait_for(1, WAIT).await[0];
    assert_eq!(message["rcptTo"], json!(["qa@team.example"]));
    assert_eq!(header(message, "x-test-send"), "true");
    assert_eq!(message["headers"]["list-unsubscribe"], Value::Null, "a test unsubscribes no one");
    assert_eq!(header(message, "subject"), "Neuigkeiten für Jürgen: Grüße!");
    assert_eq!(header(message, "content-language"), "de");
    assert_eq!(message["dkim"]["valid"], true, "{}", message["dkim"]);
    let signed = message["dkim"]["signedHeaders"].as_array().cloned().unwrap_or_default();
    assert!(signed.contains(&json!("x-test-send")), "the mark is signed: {signed:?}");
    let html = message["html"].as_str().unwrap_or_default();
    assert!(html.contains("https://api.example.test/v1/emails/preview/unsubscribe") && !html.contains("/t/"), "{html}");
    // Its unsubscribe link tells a person it unsubscribes no one; an API client gets a 404.
    let page = app
        .request(reqwest::Method::GET, "/emails/preview/unsubscribe", None)
        .header("Accept", "text/html")
        .send()
        .await
        .expect("answered");
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.text().await.unwrap_or_default().contains("unsubscribes no one"));
    let json_client = app.get("/emails/preview/unsubscribe", MAIL_KEY).await;
    assert_eq!(json_client.code(), &json!("email_not_found"), "{:?}", json_client.body);
    // Its story says it is a test, to whom (masked) and from which key.
    let story = app.get(&format!("/emails/{email_id}"), MAIL_KEY).await;
    assert_eq!(story.status, 200, "{:?}", story.body);
    let data = &story.body["data"];
    assert_eq!(data["origin"]["type"], "test", "{data}");
    assert_eq!(data["origin"]["to"], "q***@team.example", "{data}");
    assert_eq!((&data["status"], &data["contactId"]), (&json!("sent"), &json!(jurgen)), "{data}");
    assert_eq!(data["locale"], json!({"tag": "de", "source": "exact"}));
    assert_conforms("EmailStory", std::slice::from_ref(data));
    let other = app.get(&format!("/emails/{email_id}"), ALPHA_ADMIN).await;
    assert_eq!(other.status, 404, "another space sees no test of this one");
    // Given data renders too; its story names no contact.
    let given = test(json!({"to": "qa@team.example", "data": {"contact": {"firstName": "Kim"}}, "locale": "ja"})).await;
    assert_eq!(given.body["data"]["status"], "sent", "{:?}", given.body);
    let given_id = given.body["data"]["emailId"].as_str().expect("emailId");
    let story = app.get(&format!("/emails/{given_id}"), MAIL_KEY).await;
    assert_eq!(story.body["data"]["contactId"], Value::Null, "{:?}", story.body);
    // A suppressed address is refused; a bad body is a 400.
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "gone@team.example", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    let refused = test(json!({"to": "gone@team.example", "contactId": jurgen})).await;
    assert_eq!((refused.status, refused.code().clone()), (422, json!("recipient_suppressed")), "{:?}", refused.body);
    for (body, code) in [
        (json!({"contactId": jurgen}), "invalid_field"),
        (json!({"to": "not an address", "contactId": jurgen}), "invalid_field"),
        (json!({"to": "qa@team.example", "contactId": jurgen, "bcc": "x@example.com"}), "unknown_field"),
    ] {
        let refused = test(body.clone()).await;
        assert_eq!((refused.status, refused.code().clone()), (400, json!(code)), "{body}: {:?}", refused.body);
    }
    // Nothing counts it: not the delivery log, the contact's emails or webhooks' sources.
    app.wait_for_projections().await;
    let log = app.get("/emails", MAIL_KEY).await;
    assert_eq!(log.body["data"].as_array().map(Vec::len), Some(0), "{:?}", log.body);
    let scheduled = app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EmailScheduled.v1'").await;
    assert_eq!(scheduled, 0, "a test is no contact's email");
    assert_eq!(sink.messages().await.len(), 2, "the refused tests sent nothing");
}

#[tokio::test]
async fn test_sends_are_limited_per_key_and_a_limited_caller_is_told_when_to_retry() {
    let sink = SmtpSink::start().await;
    let limits = platform::settings::RateLimits { test_sends_per_minute: 2, ..crate::helpers::unlimited() };
    let app =
        TestApp::spawn_with(Options { email: Some(test_email(&sink)), limits: Some(limits), ..Options::default() })
            .await;
    app.apply_workspace(&content_workspace(|_| {}), true).await;
    publish_dkim(&app, &sink).await;
    let body = json!({"to": "qa@team.example", "data": {"contact": {"firstName": "Kim"}}});
    let mut statuses = Vec::new();
    let mut limited = None;
    // A fixed window of a minute: five at once cross at most one boundary, so at most four pass.
    for _ in 0..5 {
        let response = app.post("/templates/newsletter/test", MAIL_KEY, &body).await;
        statuses.push(response.status);
        if response.status == 429 {
            limited = Some(response);
        }
    }
    let limited = limited.unwrap_or_else(|| panic!("no test send was limited: {statuses:?}"));
    assert_eq!(limited.code(), &json!("rate_limit_exceeded"), "{:?}", limited.body);
    assert!(limited.header("retry-after").is_some(), "{:?}", limited.headers);
    let passed = statuses.iter().filter(|status| **status == 200).count();
    assert!((2..=4).contains(&passed), "{statuses:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.messages().await.len(), passed, "a limited test sends nothing");
    // Other writes of the key are not in the test bucket.
    let preview = preview(&app, "newsletter", &json!({"data": {"contact": {"firstName": "Kim"}}})).await;
    assert_eq!(preview.status, 200, "{:?}", preview.body);
}

/// The page text of the content space: German and Arabic words for the recipient pages, and
/// the news topic named in both.
fn localized_pages(space: &mut Value) {
    space["pageText"] = json!({
        "de": {
            "preferences.title": "E-Mail-Einstellungen",
            "preferences.leaveTopic": "Von {topic} abmelden",
            "preferences.leaveAll": "Von allem abmelden",
            "parties.fromTo": "E-Mail von {sender} an {recipient}.",
            "unsubscribed.title": "Sie sind abgemeldet",
            "unsubscribed.topic": "Sie erhalten keine E-Mails mehr zu {topic}.",
            "form.pending": "Danke! Bitte bestätigen Sie über den Link in Ihrem Posteingang.",
            "form.confirmed": "Ihr Abonnement ist bestätigt. Danke!"
        },
        "ar": {"preferences.title": "إعدادات البريد الإلكتروني", "preferences.leaveAll": "إلغاء الاشتراك من الكل"}
    });
    space["topics"][0]["locales"] = json!({
        "de": {"name": "Neuigkeiten", "description": "Produktneuigkeiten"},
        "ar": {"name": "الأخبار"}
    });
    // The German layout names the topic the mail came under.
    space["layouts"][0]["locales"]["de"]["text"] = json!(
        "{{ content }}\n\n-- \nSie erhalten dies zu {{ subscribedTo }}.\n{{ postalAddress }}\nAbmelden: {{ unsubscribeUrl }}"
    );
    // The double opt-in form takes the contact's language too.
    let forms = space["forms"].as_array_mut().expect("forms");
    let signup = forms.iter_mut().find(|form| form["slug"] == "signup").expect("the signup form");
    signup["fields"]["language"] = json!("language");
}

/// A page as a browser gets it.
async fn page(app: &TestApp, method: reqwest::Method, path: &str, form: Option<&[(&str, &str)]>) -> (u16, String) {
    let mut request = app.request(method, path, None).header("Accept", "text/html");
    if let Some(fields) = form {
        request = request.form(fields);
    }
    let response = request.send().await.expect("answered");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a page"))
}

#[tokio::test]
async fn a_recipients_pages_speak_the_language_of_their_mail_with_english_for_what_the_space_does_not_give() {
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options { email: Some(test_email(&sink)), ..Options::default() }).await;
    app.apply_workspace(&content_workspace(localized_pages), true).await;
    publish_dkim(&app, &sink).await;
    let template = crate::email::template_id(&app, "newsletter").await;
    let mut pages = Vec::new();
    for (email, language) in
        [("de@example.com", Some("de-DE")), ("ar@example.com", Some("ar")), ("en@example.com", None)]
    {
        reader(&app, email, "Kim", language).await;
        let sent = crate::email::send(&app, &template, &json!({"data": {"contact": {"email": email}}}), None).await;
        assert_eq!(sent.body["data"]["status"], "sent", "{:?}", sent.body);
        let email_id = sent.body["data"]["emailId"].as_str().expect("emailId").to_owned();
        let (status, preferences) =
            page(&app, reqwest::Method::GET, &format!("/emails/{email_id}/unsubscribe"), None).await;
        assert_eq!(status, 200, "{preferences}");
        pages.push((email_id, preferences));
    }
    // German: the space's words, the topic's German name, English for what it does not give.
    let (german_email, german) = &pages[0];
    assert!(german.contains("<html lang=\"de\" dir=\"ltr\">"), "{german}");
    assert!(german.contains("<h1>E-Mail-Einstellungen</h1>"), "{german}");
    assert!(
        german.contains("E-Mail von \u{2068}Équipe Exemple\u{2069} an \u{2068}d***@example.com\u{2069}."),
        "{german}"
    );
    assert!(german.contains("Von Neuigkeiten abmelden</button>"), "{german}");
    assert!(german.contains("<legend>Neuigkeiten</legend>") && german.contains("Produktneuigkeiten"), "{german}");
    assert!(german.contains("Save my preferences"), "the English stands for a key not given: {german}");
    // The mail itself names the topic as its page does.
    let messages = sink.wait_for(3, WAIT).await;
    let mail = messages.iter().find(|message| message["rcptTo"][0] == "de@example.com").expect("the German mail");
    let text = mail["text"].as_str().unwrap_or_default();
    assert!(text.contains("Sie erhalten dies zu Neuigkeiten."), "{text}");
    // Arabic: right to left, the topic's Arabic name with its English description.
    let (_, arabic) = &pages[1];
    assert!(arabic.contains("<html lang=\"ar\" dir=\"rtl\">"), "{arabic}");
    assert!(arabic.contains("إعدادات البريد الإلكتروني") && arabic.contains("<legend>الأخبار</legend>"), "{arabic}");
    assert!(arabic.contains("Product news"), "{arabic}");
    // The address, written left to right, is isolated in the right-to-left sentence.
    assert!(arabic.contains("\u{2068}a***@example.com\u{2069}"), "{arabic}");
    // No locale: the platform's English.
    let (_, english) = &pages[2];
    assert!(english.contains("<html lang=\"en\" dir=\"ltr\">") && english.contains("<h1>Email preferences</h1>"));
    assert!(english.contains("Unsubscribe from News</button>"), "{english}");
    // Pressing the button: the page after it speaks German too.
    let (status, left) = page(
        &app,
        reqwest::Method::POST,
        &format!("/emails/{german_email}/unsubscribe"),
        Some(&[("List-Unsubscribe", "One-Click")]),
    )
    .await;
    assert_eq!(status, 200, "{left}");
    assert!(left.contains("<html lang=\"de\"") && left.contains("<h1>Sie sind abgemeldet</h1>"), "{left}");
    assert!(left.contains("Sie erhalten keine E-Mails mehr zu Neuigkeiten."), "{left}");
    assert!(left.contains("Change your other email preferences"), "{left}");

    // A double opt-in form: its thanks and its confirmation page in the submitter's language.
    let (status, thanks) = page(
        &app,
        reqwest::Method::POST,
        &format!("/forms/{}/submit", crate::email::SIGNUP_FORM),
        Some(&[("email_address", "neu@example.com"), ("first_name", "Uwe"), ("language", "de")]),
    )
    .await;
    assert_eq!(status, 200, "{thanks}");
    assert!(thanks.contains("<html lang=\"de\"") && thanks.contains("Bitte bestätigen Sie"), "{thanks}");
    let message = sink.wait_for(4, WAIT).await.into_iter().find(|message| message["rcptTo"][0] == "neu@example.com");
    let path = crate::email::confirmation_path(&message.expect("the confirmation mail"));
    let (status, confirmed) = page(&app, reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 200, "{confirmed}");
    assert!(
        confirmed.contains("<html lang=\"de\"") && confirmed.contains("Ihr Abonnement ist bestätigt."),
        "{confirmed}"
    );

    // `apply` refuses page text it could not show, naming the locale and the key.
    let refused = refusal(
        &app,
        &content_workspace(|space| {
            localized_pages(space);
            space["pageText"]["de"]["preferences.leaveTopic"] = json!("Von {thema} abmelden");
        }),
    )
    .await;
    assert!(refused.contains("pageText.de") && refused.contains("{thema}") && refused.contains("{topic}"), "{refused}");
    let refused = refusal(&app, &content_workspace(|space| space["pageText"] = json!({"de": {"title": "x"}}))).await;
    assert!(refused.contains("\"title\" is no page text key"), "{refused}");
}
