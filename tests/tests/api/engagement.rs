//! Engagement: the tracking links and the open pixel of real mail. A message goes over SMTP
//! to the loopback sink; the test reads it, follows its rewritten links and fetches its pixel
//! over HTTP like a mail client and a browser, and a receiver that checks signatures with
//! `standardwebhooks` gets `email.clicked` and `email.opened`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::email::{MAIL_KEY, email_id_of, email_webhook, mail_app, mail_workspace_with_promo, send, template_id};
use crate::helpers::*;
use crate::smtp_sink::SmtpSink;

const WAIT: Duration = Duration::from_secs(20);
pub(crate) const PUBLIC_BASE: &str = "https://api.example.test/v1";
const BROWSER: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0";

/// The promo template (marketing, no topic) with three links: one to track (its target
/// personal and entity-encoded), a `mailto:`, and one marked to be left alone.
fn promo_with_links() -> String {
    mail_workspace_with_promo(|promo| {
        promo["html"] = json!(
            "<html><body><p>Hi <a href=\"https://shop.example.com/a?who={{ contact.firstName }}&amp;x=1\">Shop</a> \
             <a href=\"https://shop.example.com/b\">Sale</a> <a href=\"mailto:help@example.com\">Mail us</a> \
             <a href=\"https://docs.example.com/\" data-track=\"false\">Docs</a></p></body></html>"
        );
    })
}

/// The value of every `attribute="…"` in `html` that starts with `prefix`, entities decoded.
pub(crate) fn attributes(html: &str, attribute: &str, prefix: &str) -> Vec<String> {
    let opening = format!("{attribute}=\"{prefix}");
    html.match_indices(&opening)
        .filter_map(|(at, _)| {
            let value = &html[at + attribute.len() + 2..];
            value.find('"').map(|end| value[..end].replace("&amp;", "&"))
        })
        .collect()
}

/// The tracked URLs of a received message: `path` is `click?` for its links, `open?sig=`
/// for its pixel.
pub(crate) fn tracked(message: &Value, path: &str) -> Vec<String> {
    let email_id = email_id_of(message);
    let attribute = if path.starts_with("open") { "src" } else { "href" };
    let prefix = format!("{PUBLIC_BASE}/emails/{email_id}/{path}");
    attributes(message["html"].as_str().unwrap_or_default(), attribute, &prefix)
}

/// A client that does not follow redirects, as the test must see the 302 itself.
fn client() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("a client")
}

/// `url` (under the public base URL) on the test's command service.
pub(crate) fn local(app: &TestApp, url: &str) -> String {
    url.replacen(PUBLIC_BASE, &app.command_url, 1)
}

pub(crate) async fn get(app: &TestApp, url: &str) -> reqwest::Response {
    client().get(local(app, url)).header("User-Agent", BROWSER).send().await.expect("the request")
}

async fn refused(app: &TestApp, url: &str) {
    let answer = get(app, url).await;
    assert_eq!(answer.status(), 404, "{url}");
    assert!(answer.headers().get("location").is_none(), "never redirected: {url}");
    let body: Value = answer.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "link_not_found", "{body}");
}

#[tokio::test]
async fn tracked_links_redirect_once_recorded_forged_ones_never_and_the_pixel_counts_opens() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    app.apply_workspace(&promo_with_links(), true).await;
    let receiver = email_webhook(&app, &["opened", "clicked"]).await;
    let promo = template_id(&app, "promo").await;
    let name = format!("Zelda{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    let body = json!({"data": {"contact": {"email": "zelda@example.com", "firstName": name, "newsConsent": true}}});
    let sent = send(&app, &promo, &body, None).await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    let messages = sink.wait_for(1, WAIT).await;
    let delivered = Instant::now();
    let message = &messages[0];
    let email_id = email_id_of(message);
    assert_eq!(message["dkim"]["valid"], true, "the rewritten HTML is what is signed: {:?}", message["dkim"]);
    let html = message["html"].as_str().expect("an HTML part");

    // The two web links are tracked; the mailto, the one marked to skip and the unsubscribe
    // link are left as they are; the pixel closes the body.
    let clicks = attributes(html, "href", &format!("{PUBLIC_BASE}/emails/{email_id}/click?"));
    assert_eq!(clicks.len(), 2, "{html}");
    assert!(html.contains("href=\"mailto:help@example.com\""), "{html}");
    assert!(html.contains("<a href=\"https://docs.example.com/\">Docs</a>"), "the skip mark is removed: {html}");
    assert!(html.contains(&format!("href=\"{PUBLIC_BASE}/emails/{email_id}/unsubscribe\"")), "{html}");
    assert!(!html.contains("shop.example.com/a?who") || html.contains("url=https%3A%2F%2Fshop"), "{html}");
    let pixels = attributes(html, "src", &format!("{PUBLIC_BASE}/emails/{email_id}/open?sig="));
    assert_eq!(pixels.len(), 1, "{html}");
    assert!(html.find("/open?sig=") > html.find("Unsubscribe or change"), "the pixel comes last: {html}");
    let text = message["text"].as_str().expect("a text part");
    assert!(!text.contains("/click?"), "the text part is not rewritten: {text}");
    let (shop, sale, pixel) = (&clicks[0], &clicks[1], &pixels[0]);

    // A scanner follows every link as the message arrives, at once: redirected, recorded,
    // and flagged as a machine's.
    let (first, second) = tokio::join!(get(&app, shop), get(&app, sale));
    assert_eq!((first.status().as_u16(), second.status().as_u16()), (302, 302));
    let target = format!("https://shop.example.com/a?who={name}&x=1");
    assert_eq!(first.headers()["location"], target.as_str(), "entities decoded");
    assert_eq!(second.headers()["location"], "https://shop.example.com/b");
    assert_eq!(first.headers()["referrer-policy"], "no-referrer");
    assert_eq!(first.headers()["cache-control"], "no-store");

    // Forged links: never a redirect, never a record.
    let signature = shop.rsplit_once("&sig=").expect("a signature").1.to_owned();
    let changed_target = shop.replace("x%3D1", "x%3D2");
    assert_ne!(&changed_target, shop);
    let mut changed_signature = shop.clone();
    let last = changed_signature.pop().expect("a character");
    changed_signature.push(if last == 'A' { 'B' } else { 'A' });
    let open_signature = pixel.rsplit_once("sig=").expect("a signature").1;
    let elsewhere =
        format!("{PUBLIC_BASE}/emails/https%3A%2F%2Fevil.example/click?url=https%3A%2F%2Fevil.example&sig=1.x");
    for forged in [
        changed_target,
        changed_signature,
        shop[..shop.len() - 3].to_owned(),
        shop.replace(&signature, open_signature),
        shop.replace(&format!("&sig={signature}"), ""),
        shop.replace(&format!("/emails/{email_id}/"), "/emails/em_0000000000000000000000000000000a/"),
        shop.replace(&format!("&sig={signature}"), &format!("&sig=2.{}", &signature[2..])),
        format!("{PUBLIC_BASE}/emails/{email_id}/click?url=https%3A%2F%2Fevil.example%2F&sig={signature}"),
        elsewhere,
    ] {
        refused(&app, &forged).await;
    }
    refused(&app, &pixel.replace(open_signature, &signature)).await;
    let page = client()
        .get(local(&app, &shop.replace(&signature, "1.AAAA")))
        .header("Accept", "text/html")
        .send()
        .await
        .expect("the request");
    assert_eq!(page.status(), 404);
    assert!(page.headers()["content-type"].to_str().is_ok_and(|kind| kind.starts_with("text/html")));

    // A person opens the message: the pixel is a GIF, and the open a person's.
    let opened = get(&app, pixel).await;
    assert_eq!(opened.status(), 200);
    assert_eq!(opened.headers()["content-type"], "image/gif");
    assert!(opened.bytes().await.expect("the image").starts_with(b"GIF89a"));
    // A HEAD is a link checker's.
    let head = client().head(local(&app, shop)).header("User-Agent", BROWSER).send().await.expect("HEAD");
    assert_eq!(head.status(), 302);

    // Later, the person clicks: the first click of the link by a person.
    tokio::time::sleep(Duration::from_millis(10_500).saturating_sub(delivered.elapsed())).await;
    let clicked = get(&app, shop).await;
    assert_eq!((clicked.status().as_u16(), clicked.headers()["location"].to_str().ok()), (302, Some(target.as_str())));

    let deliveries = receiver.wait_for("mail", 5, WAIT).await;
    assert!(deliveries.iter().all(|delivery| delivery["verifiedWith"] == json!([0])), "signed: {deliveries:?}");
    let mut seen: Vec<(String, Value, Value, Value)> = deliveries
        .iter()
        .map(|delivery| {
            let data = &delivery["body"]["data"];
            assert_eq!(data["emailId"], email_id.as_str());
            assert_eq!(data["templateId"], promo.as_str());
            let kind = delivery["body"]["type"].as_str().unwrap_or_default().to_owned();
            (kind, data["url"].clone(), data["first"].clone(), data["machine"].clone())
        })
        .collect();
    seen.sort_by_key(|(kind, url, _, machine)| (kind.clone(), url.to_string(), machine.to_string()));
    let shop_url = json!(target);
    assert_eq!(
        seen,
        vec![
            ("email.clicked".to_owned(), shop_url.clone(), json!(false), json!("head")),
            ("email.clicked".to_owned(), shop_url.clone(), json!(true), json!("right_after_delivery")),
            ("email.clicked".to_owned(), shop_url.clone(), json!(true), Value::Null),
            (
                "email.clicked".to_owned(),
                json!("https://shop.example.com/b"),
                json!(true),
                json!("right_after_delivery")
            ),
            ("email.opened".to_owned(), Value::Null, json!(true), Value::Null),
        ]
    );
    let clicked_events = app
        .query_i64(&format!(
            "SELECT count(*) FROM events WHERE stream_id = 'email-{email_id}' AND event_type = 'EmailClicked.v1'"
        ))
        .await;
    assert_eq!(clicked_events, 4, "each click once, no forged one");

    // The contact's audit trail tells the same story, with the link.
    let contact_id =
        app.get("/schemas/people/records", MAIL_KEY).await.body["data"][0]["id"].as_str().expect("id").to_owned();
    let trail = app.get(&format!("/schemas/people/records/{contact_id}/audit-trail"), MAIL_KEY).await;
    assert_eq!(trail.status, 200, "{:?}", trail.body);
    let entries = trail.body["data"].as_array().expect("entries");
    let human_click = entries
        .iter()
        .find(|entry| entry["type"] == "email_clicked" && entry["machine"].is_null())
        .expect("the person's click");
    assert_eq!((&human_click["url"], &human_click["first"]), (&shop_url, &json!(true)));
    assert!(entries.iter().any(|entry| entry["type"] == "email_opened" && entry["first"] == true));

    // The email's story: sent, opened and clicked, with machines counted apart (once the
    // read model has every click: the webhooks may arrive before it applies the last).
    app.wait_for_workers().await;
    let story = app.get(&format!("/emails/{email_id}"), MAIL_KEY).await;
    assert_eq!(story.status, 200, "{:?}", story.body);
    let story = &story.body["data"];
    assert_eq!(
        (&story["id"], &story["contactId"], &story["templateId"]),
        (&json!(email_id), &json!(contact_id), &json!(promo))
    );
    assert_eq!((&story["status"], &story["origin"]), (&json!("sent"), &json!({"type": "template"})));
    let engagement = &story["engagement"];
    assert_eq!(
        [&engagement["opens"], &engagement["humanOpens"], &engagement["clicks"], &engagement["humanClicks"]],
        [&json!(1), &json!(1), &json!(4), &json!(1)],
        "{story}"
    );
    let timeline: Vec<(&str, &Value)> = story["timeline"]
        .as_array()
        .expect("a timeline")
        .iter()
        .map(|entry| (entry["type"].as_str().unwrap_or_default(), &entry["machine"]))
        .collect();
    assert_eq!(timeline[..2], [("scheduled", &Value::Null), ("sent", &Value::Null)], "{story}");
    assert_eq!(timeline.iter().filter(|(kind, _)| *kind == "clicked").count(), 3, "firsts only: {story}");
    let person_click = story["timeline"]
        .as_array()
        .and_then(|timeline| timeline.iter().find(|entry| entry["type"] == "clicked" && entry["machine"].is_null()))
        .expect("the person's click");
    assert_eq!(person_click["url"], shop_url, "the target, opened from the log: {story}");
    assert!(timeline.contains(&("opened", &Value::Null)), "{story}");
    // The contact's emails: this one, without its timeline; none for another space.
    let listed = app.get(&format!("/emails?contactId={contact_id}"), MAIL_KEY).await;
    assert_eq!(listed.status, 200, "{:?}", listed.body);
    assert_eq!(listed.body["pagination"]["totalCount"], 1, "{:?}", listed.body);
    let item = &listed.body["data"][0];
    assert_eq!((&item["id"], &item["engagement"]["humanClicks"]), (&json!(email_id), &json!(1)));
    assert!(item.get("timeline").is_none(), "{item}");
    assert_conforms("EmailSummary", std::slice::from_ref(item));
    let elsewhere = app.get(&format!("/emails?contactId={contact_id}"), ALPHA_ADMIN).await;
    assert_eq!(
        (elsewhere.body["pagination"]["totalCount"].clone(), elsewhere.body["data"].clone()),
        (json!(0), json!([]))
    );
    let whole = app.get("/emails", MAIL_KEY).await;
    assert_eq!(whole.status, 200, "the space's whole log: {:?}", whole.body);
    assert_eq!(whole.body["pagination"]["totalCount"], Value::Null, "{:?}", whole.body);
    assert!(whole.body["data"].as_array().is_some_and(|rows| rows.iter().any(|row| row["id"] == email_id)));
    let unknown = app.get("/emails/em_0000000000000000000000000000000a", MAIL_KEY).await;
    assert_eq!((unknown.status, unknown.code().clone()), (404, json!("email_not_found")));

    // The target names the person: it is sealed under the contact's key, never in the clear.
    let dump = crate::erasure::dump(&app).await;
    let found = crate::erasure::occurrences(&dump, &format!("who={name}"));
    assert!(found.is_empty(), "a clicked link in the clear: {found:?}");

    // Erasing the contact shreds its engagement: the story goes, the links cannot be opened,
    // and a click on its old mail still redirects but records nothing.
    let deleted = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/people/records/{contact_id}"), Some(MAIL_KEY)))
        .await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    let operation_id = deleted.body["data"]["operationId"].as_str().expect("operationId").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.get(&format!("/record-deletions/{operation_id}"), MAIL_KEY).await.body["data"]["status"] != "completed" {
        assert!(Instant::now() < deadline, "the deletion did not complete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone = app.get(&format!("/emails/{email_id}"), MAIL_KEY).await;
    assert_eq!((gone.status, gone.code().clone()), (404, json!("email_not_found")), "{:?}", gone.body);
    let listed = app.get(&format!("/emails?contactId={contact_id}"), MAIL_KEY).await;
    assert_eq!((listed.body["pagination"]["totalCount"].clone(), listed.body["data"].clone()), (json!(0), json!([])));
    let after = get(&app, shop).await;
    assert_eq!(after.status(), 302, "the link is still this service's");
    app.wait_for_workers().await;
    assert_eq!(
        app.query_i64(&format!(
            "SELECT count(*) FROM events WHERE stream_id = 'email-{email_id}' AND event_type = 'EmailClicked.v1'"
        ))
        .await,
        4,
        "nothing recorded for an erased contact"
    );
    let dump = crate::erasure::dump(&app).await;
    for needle in [name.as_str(), "zelda@example.com"] {
        let found = crate::erasure::occurrences(&dump, needle);
        assert!(found.is_empty(), "{needle:?} is still in the database: {found:?}");
    }
}

/// Applies `workspace`, sends the promo template, and answers the HTML of the `count`th
/// message.
async fn promo_html(app: &TestApp, sink: &SmtpSink, workspace: &str, count: usize) -> String {
    app.apply_workspace(workspace, true).await;
    let promo = template_id(app, "promo").await;
    let body = json!({"data": {"contact": {"email": "t@example.com", "newsConsent": true}}});
    let sent = send(app, &promo, &body, None).await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    let email_id = sent.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    let messages = sink.wait_for(count, WAIT).await;
    let message = messages.iter().find(|message| email_id_of(message) == email_id).expect("the message");
    message["html"].as_str().expect("html").to_owned()
}

#[tokio::test]
async fn tracking_follows_the_template_and_the_space_turns_it_off() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    let link = "<p><a href=\"https://shop.example.com/\">Shop</a></p>";
    let tracked = |html: &str| (html.contains("/click?url="), html.contains("/open?sig="));

    let html = promo_html(&app, &sink, &mail_workspace_with_promo(|promo| promo["html"] = json!(link)), 1).await;
    assert_eq!(tracked(&html), (true, true), "marketing mail is tracked by default: {html}");
    let opens_off = mail_workspace_with_promo(|promo| {
        promo["html"] = json!(link);
        promo["tracking"] = json!({"opens": false});
    });
    let html = promo_html(&app, &sink, &opens_off, 2).await;
    assert_eq!(tracked(&html), (true, false), "the template turns opens off: {html}");
    let clicks_off =
        space_tracking(mail_workspace_with_promo(|promo| promo["html"] = json!(link)), json!({"clicks": false}));
    let html = promo_html(&app, &sink, &clicks_off, 3).await;
    assert_eq!(tracked(&html), (false, true), "the space turns clicks off: {html}");
}

/// `workspace` with the mail space's `emailTracking` set.
fn space_tracking(workspace: String, tracking: Value) -> String {
    let mut workspace: Value = serde_json::from_str(&workspace).expect("JSON");
    if let Some(space) =
        workspace["spaces"].as_array_mut().and_then(|spaces| spaces.iter_mut().find(|space| space["slug"] == "mail"))
    {
        space["emailTracking"] = tracking;
    }
    workspace.to_string()
}

#[tokio::test]
async fn segments_gain_a_contact_on_its_open_or_click_and_lose_it_when_the_window_passes() {
    use crate::segments::{defined, members, wait_for_members};

    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 100).await;
    app.apply_workspace(&promo_with_links(), true).await;
    let recent = defined(&app, MAIL_KEY, "Opened lately", "opened an email in the last 4 seconds").await;
    let sale_any = defined(
        &app,
        MAIL_KEY,
        "Looked at the sale",
        "clicked a link containing /B in an email from template promo including machines",
    )
    .await;
    let sale_people = defined(&app, MAIL_KEY, "People at the sale", "clicked a link containing /b").await;
    let sunset = defined(&app, MAIL_KEY, "Sunset", "has not opened an email").await;
    let promo = template_id(&app, "promo").await;
    let body = json!({"data": {"contact": {"email": "yara@example.com", "firstName": "Yara", "newsConsent": true}}});
    let sent = send(&app, &promo, &body, None).await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    let messages = sink.wait_for(1, WAIT).await;
    let clicks = tracked(&messages[0], "click?");
    let pixel = &tracked(&messages[0], "open?sig=")[0];
    wait_for_members(&app, MAIL_KEY, &sunset, &["yara@example.com"]).await;

    // A link checker's HEAD of the pixel is a machine's open: no segment counts it.
    let head = client().head(local(&app, pixel)).header("User-Agent", BROWSER).send().await.expect("HEAD");
    assert_eq!(head.status(), 200);
    // A scanner follows the sale link as the message arrives: a machine's click.
    let scanned = get(&app, &clicks[1]).await;
    assert_eq!(scanned.headers()["location"], "https://shop.example.com/b");
    wait_for_members(&app, MAIL_KEY, &sale_any, &["yara@example.com"]).await;
    assert!(members(&app, MAIL_KEY, &sale_people).await.is_empty(), "a machine's click is not a person's");
    assert!(members(&app, MAIL_KEY, &recent).await.is_empty(), "a machine's open is not a person's");

    // The person opens it: in "opened lately" at once, out again four seconds later, and
    // out of the sunset segment for good.
    assert_eq!(get(&app, pixel).await.status(), 200);
    wait_for_members(&app, MAIL_KEY, &recent, &["yara@example.com"]).await;
    assert!(members(&app, MAIL_KEY, &sunset).await.is_empty(), "an open ends the sunset");
    wait_for_members(&app, MAIL_KEY, &recent, &[]).await;
    assert!(members(&app, MAIL_KEY, &sunset).await.is_empty());
}

/// Clicks and opens of concurrent requests are inserted in one statement: each hit answered
/// is a row of the inbox, once, and a hit whose statement fails is answered with the error,
/// never as stored.
#[tokio::test]
async fn concurrent_hits_are_taken_in_together_and_each_answered_hit_is_stored_once() {
    use command_service::engagement::store::{Hit, Inbox};
    // No projector: the engagement worker would drain the inbox while it is counted.
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let inbox = Inbox::start(app.pool.clone());
    let email_id = format!("em_{}", uuid::Uuid::now_v7().simple());
    let hit = |index: i64| Hit {
        email_id: email_id.clone(),
        kind: if index % 2 == 0 { "click" } else { "open" },
        link: (index % 2 == 0).then(|| index.to_be_bytes().to_vec()),
        link_id: if index % 2 == 0 { format!("link-{index}") } else { String::new() },
        link_position: if index % 2 == 0 { 1 } else { 0 },
        signal: "",
        at_ms: index,
    };
    let answers = futures_util::future::join_all((0..300).map(|index| inbox.take_in(hit(index)))).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let client = app.pool.get().await.expect("a connection");
    let rows = client
        .query("SELECT at_ms, kind, link FROM engagement_inbox WHERE email_id = $1 ORDER BY at_ms", &[&email_id])
        .await
        .expect("the inbox");
    let stored: Vec<(i64, String, Option<Vec<u8>>)> =
        rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect();
    let expected: Vec<(i64, String, Option<Vec<u8>>)> =
        (0..300).map(&hit).map(|hit| (hit.at_ms, hit.kind.to_owned(), hit.link)).collect();
    assert_eq!(stored, expected, "every hit once, as taken in");

    // A statement the database refuses (a NUL cannot be stored in text) stores nothing and
    // answers its hit with the error.
    let refused = Hit { email_id: "em_\0".to_owned(), ..hit(300) };
    assert!(inbox.take_in(refused).await.is_err());
    let count: i64 =
        client.query_one("SELECT count(*) FROM engagement_inbox WHERE at_ms = 300", &[]).await.expect("a count").get(0);
    assert_eq!(count, 0);
}
