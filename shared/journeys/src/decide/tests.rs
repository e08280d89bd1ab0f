use std::collections::{BTreeMap, BTreeSet};

use domain::records::RecordState;
use domain::workflows::{EngagementAction, Source, Step, StepKind, Wait};
use mail::send::{Authored, Gate};
use mail::skipped::DecidedBy;
use platform::log::ExpectedVersion;
use serde_json::{Value, json};

use super::tick::InFlight;
use super::*;
use domain::webhooks::attempt::AttemptResult;

const NOW: i64 = 1_800_000_000_000;

fn step(id: &str, kind: StepKind) -> Step {
    Step { id: id.into(), kind }
}

fn next(id: &str) -> Option<String> {
    Some(id.to_owned())
}

fn workflow(steps: Vec<Step>) -> WorkflowDef {
    WorkflowDef {
        slug: "onboarding".into(),
        name: "Onboarding".into(),
        status: domain::workflows::Status::Published,
        contact_schema_id: "sch_contacts".into(),
        entry: "start".into(),
        reference_id: "wh-onboarding".into(),
        steps,
        triggers: Vec::new(),
        signing: None,
        in_flight: domain::workflows::InFlightRule::Pin,
    }
}

fn entry(then: &str) -> Step {
    step("start", StepKind::IncomingWebhook { reference_id: "wh-onboarding".into(), next: next(then) })
}

/// A run of the contact `con_1`, `status`, at `step_id`, with nothing in flight.
fn row(status: RunStatus, step_id: Option<&str>) -> Row {
    Row {
        status,
        step_id: step_id.map(str::to_owned),
        step_count: 1,
        version: 2,
        ..Row::requested("run_1", "wf_1", "spc_1", Some("con_1".into()))
    }
}

/// `row` with `step_id` in flight since the run's second step.
fn in_flight(status: RunStatus, step: &Step, attempt: u32, attempting: bool) -> Row {
    let mut row = row(status, Some(&step.id));
    row.in_flight = Some(InFlight {
        index: 2,
        step_id: step.id.clone(),
        step_type: step.kind.type_name().into(),
        started_at_ms: NOW - 1000,
        attempt,
        attempting,
        until_ms: Some(NOW + 3_600_000),
    });
    row
}

fn contact(email: Option<&str>, values: Value) -> ContactFacts {
    ContactFacts::Live(Box::new(Contact {
        version: 3,
        state: RecordState {
            record_id: "con_1".into(),
            space_id: "spc_1".into(),
            schema_id: "sch_contacts".into(),
            schema_type: "contact".into(),
            source: "api".into(),
            created_at_ms: NOW - 10_000,
            updated_at_ms: NOW - 10_000,
            personal: Some(proto::RecordPersonal {
                email: email.map(str::to_owned),
                values_json: values.to_string(),
                ..Default::default()
            }),
        },
        key: None,
        consent: Some(true),
        consent_keys: vec!["marketingConsent".into()],
        subscriptions: BTreeMap::from([("top_news".to_owned(), "subscribed".to_owned())]),
        segments: BTreeSet::new(),
        attributes: vec![domain::catalog::AttributeEntry { key: "plan".into(), definition: json!({"type": "string"}) }],
    }))
}

fn with_contact(contact: ContactFacts) -> Facts {
    Facts { contact: Some(contact), ..Facts::default() }
}

const SCHEDULE: &[u64] = &[1000, 2000];

static SITE: std::sync::LazyLock<mail::send::Site> = std::sync::LazyLock::new(|| mail::send::Site {
    base_url: "https://api.example.test".to_owned(),
    links: mail::tracking::Links::derive(|_| [7; 32], 1, &[]),
});

fn given() -> Given<'static> {
    Given {
        now: NOW,
        jitter: 1.0,
        allowance_refused: false,
        call_outcome: None,
        retry_schedule_ms: SCHEDULE,
        site: &SITE,
        newer: None,
    }
}

fn decided(row: &Row, definition: &WorkflowDef, facts: &Facts, given: &Given<'_>) -> Tick {
    let opened = open(row).expect("opens");
    match decide((row, &opened), definition, facts, given).expect("decides") {
        Decided::Tick(tick) => *tick,
        Decided::Needs(need) => panic!("the decision needs {need:?}"),
    }
}

fn needs(row: &Row, definition: &WorkflowDef, facts: &Facts, given: &Given<'_>) -> Need {
    let opened = open(row).expect("opens");
    match decide((row, &opened), definition, facts, given).expect("decides") {
        Decided::Needs(need) => need,
        Decided::Tick(_) => panic!("the decision needed nothing"),
    }
}

/// The run's events: each type, with the step it names where it names one.
fn events(tick: &Tick) -> Vec<String> {
    tick.events
        .iter()
        .map(|event| match event {
            LogEvent::WorkflowStepStarted(started) => format!("started {}", started.step_id),
            LogEvent::WorkflowStepFinished(finished) => format!("{} {}", finished.status, finished.step_id),
            LogEvent::WorkflowRunFinished(finished) => format!("run {}", finished.status),
            LogEvent::WorkflowRunStarted(_) => "run started".to_owned(),
            LogEvent::WorkflowRunSleeping(_) => "sleeping".to_owned(),
            LogEvent::WorkflowRunPaused(_) => "paused".to_owned(),
            LogEvent::WorkflowRunResumed(_) => "resumed".to_owned(),
            LogEvent::WorkflowRunMigrated(moved) => {
                format!(
                    "migrated {}->{} {}->{}",
                    moved.from_revision, moved.to_revision, moved.from_step_id, moved.to_step_id
                )
            }
            other => other.event_type().to_owned(),
        })
        .collect()
}

fn finished(tick: &Tick, step_id: &str) -> proto::WorkflowStepFinished {
    tick.events
        .iter()
        .find_map(|event| match event {
            LogEvent::WorkflowStepFinished(finished) if finished.step_id == step_id => Some(finished.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("step {step_id} did not finish"))
}

#[test]
fn given_a_new_run_when_decided_then_it_starts_at_the_entry_and_sleeps_in_its_first_wait() {
    let definition =
        workflow(vec![entry("wait"), step("wait", StepKind::Wait { wait: Wait::For { ms: 60_000 }, next: None })]);
    let tick = decided(&row(RunStatus::Waiting, None), &definition, &Facts::default(), &given());
    assert_eq!(events(&tick), ["run started", "started start", "completed start", "started wait", "sleeping"]);
    assert_eq!((tick.row.status.as_str(), tick.due_ms, tick.finished), ("sleeping", Some(NOW + 60_000), false));
    assert_eq!(tick.row.in_flight.as_ref().map(|in_flight| in_flight.step_id.as_str()), Some("wait"));
}

#[test]
fn given_a_sleeping_wait_when_due_then_it_completes_and_a_run_with_no_next_step_completes() {
    let wait = step("wait", StepKind::Wait { wait: Wait::For { ms: 60_000 }, next: None });
    let definition = workflow(vec![entry("wait"), wait.clone()]);
    let tick = decided(&in_flight(RunStatus::Sleeping, &wait, 0, false), &definition, &Facts::default(), &given());
    assert_eq!(events(&tick), ["completed wait", "run completed"]);
    assert!(tick.finished && tick.due_ms.is_none() && tick.row.in_flight.is_none());
}

#[test]
fn given_a_finished_run_when_decided_then_nothing_happens() {
    let definition = workflow(vec![entry("end"), step("end", StepKind::Exit)]);
    for status in [RunStatus::Completed, RunStatus::Exited, RunStatus::Failed] {
        let tick = decided(&row(status, None), &definition, &Facts::default(), &given());
        assert!(tick.finished && tick.events.is_empty(), "{}", status.as_str());
    }
}

#[test]
fn given_a_wait_until_a_date_attribute_when_decided_then_it_needs_the_contact_and_sleeps_until_the_date() {
    let wait = Wait::UntilAttribute { attribute: "renewsOn".into(), offset_ms: -86_400_000 };
    let definition = workflow(vec![step("start", StepKind::Wait { wait, next: None })]);
    let run = row(RunStatus::Running, Some("start"));
    assert_eq!(needs(&run, &definition, &Facts::default(), &given()), Need::Contact);
    let facts = with_contact(contact(Some("ada@example.test"), json!({"renewsOn": "2030-01-02"})));
    let tick = decided(&run, &definition, &facts, &given());
    let day_before = chrono::DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z").expect("a time").timestamp_millis();
    assert_eq!(tick.due_ms, Some(day_before));
    // A missing date skips the wait.
    let facts = with_contact(contact(Some("ada@example.test"), json!({})));
    let tick = decided(&run, &definition, &facts, &given());
    assert_eq!(finished(&tick, "start").status, "skipped");
    assert_eq!(finished(&tick, "start").error_code, "attribute_missing");
}

#[test]
fn given_a_branch_when_decided_then_the_first_arm_that_holds_is_taken_else_the_default() {
    let arm = domain::workflows::Arm {
        condition: filter::parse_plain("contact.plan is pro").expect("parses"),
        description: "contact.plan is pro".into(),
        next: next("pro"),
    };
    let definition = workflow(vec![
        step("start", StepKind::Branch { arms: vec![arm], default: next("other") }),
        step("pro", StepKind::Exit),
        step("other", StepKind::Exit),
    ]);
    let run = row(RunStatus::Running, Some("start"));
    let pro = with_contact(contact(None, json!({"plan": "pro"})));
    assert_eq!(finished(&decided(&run, &definition, &pro, &given()), "start").next_step_id, "pro");
    let free = with_contact(contact(None, json!({"plan": "free"})));
    assert_eq!(finished(&decided(&run, &definition, &free, &given()), "start").next_step_id, "other");
}

#[test]
fn given_a_goto_when_its_passes_are_used_up_then_the_run_goes_on_to_its_next_step() {
    let definition = workflow(vec![
        entry("again"),
        step("again", StepKind::Goto { target: "start".into(), max_passes: 2, next: next("end") }),
        step("end", StepKind::Exit),
    ]);
    let tick = decided(&row(RunStatus::Running, Some("start")), &definition, &Facts::default(), &given());
    let gotos = events(&tick).iter().filter(|event| *event == "started again").count();
    assert_eq!(gotos, 3, "two passes back, then on");
    assert_eq!(tick.row.passes.get("again"), Some(&2));
    assert_eq!(events(&tick).last().map(String::as_str), Some("run exited"));
}

#[test]
fn given_a_long_loop_when_decided_then_one_transition_executes_at_most_its_step_budget_and_is_due_at_once() {
    let definition = workflow(vec![
        entry("again"),
        step("again", StepKind::Goto { target: "start".into(), max_passes: 10_000, next: None }),
    ]);
    let tick = decided(&row(RunStatus::Running, Some("start")), &definition, &Facts::default(), &given());
    let started = events(&tick).iter().filter(|event| event.starts_with("started")).count();
    assert_eq!(started, STEPS_PER_TICK);
    assert_eq!((tick.finished, tick.due_ms), (false, Some(NOW)));
}

#[test]
fn given_a_run_at_its_step_limit_when_decided_then_its_next_step_and_the_run_fail() {
    let definition = workflow(vec![entry("end"), step("end", StepKind::Exit)]);
    let mut run = row(RunStatus::Running, Some("start"));
    run.step_count = domain::workflows::MAX_STEP_COUNT;
    let tick = decided(&run, &definition, &Facts::default(), &given());
    assert_eq!(events(&tick), ["started start", "failed start", "run failed"]);
    assert_eq!(finished(&tick, "start").error_code, "step_limit");
}

#[test]
fn given_a_paused_workflow_when_decided_then_a_started_run_parks_under_a_guard_and_resumes_on_unpause() {
    let definition = workflow(vec![entry("end"), step("end", StepKind::Exit)]);
    let mut run = row(RunStatus::Running, Some("start"));
    run.control_paused = true;
    let parked = decided(&run, &definition, &Facts::default(), &given());
    assert_eq!(events(&parked), ["paused"]);
    assert!(parked.row.paused && parked.due_ms.is_none() && !parked.finished);
    assert_eq!(parked.guards.len(), 1, "parked only while the workflow is still paused");
    // Parked again: no second event.
    run.paused = true;
    assert!(decided(&run, &definition, &Facts::default(), &given()).events.is_empty());
    // A run that has not started waits without an event.
    let mut waiting = row(RunStatus::Waiting, None);
    waiting.control_paused = true;
    assert!(decided(&waiting, &definition, &Facts::default(), &given()).events.is_empty());
    // Unpaused: resumed, and on.
    run.control_paused = false;
    let resumed = decided(&run, &definition, &Facts::default(), &given());
    assert_eq!(events(&resumed)[0], "resumed");
    assert!(resumed.finished && !resumed.row.paused);
}

#[test]
fn given_a_step_that_needs_a_contact_when_the_run_has_none_or_it_is_gone_then_it_fails_or_exits() {
    let definition = workflow(vec![step("start", StepKind::Subscribe { topic_id: "top_news".into(), next: None })]);
    let mut run = row(RunStatus::Running, Some("start"));
    let gone = decided(&run, &definition, &with_contact(ContactFacts::Gone), &given());
    assert_eq!(events(&gone), ["run exited"]);
    run.contact_id = None;
    let none = decided(&run, &definition, &with_contact(ContactFacts::None), &given());
    assert_eq!(finished(&none, "start").error_code, "no_contact");
    assert_eq!(events(&none).last().map(String::as_str), Some("run failed"));
}

#[test]
fn given_a_send_step_when_its_template_is_gone_then_the_step_and_the_run_fail() {
    let definition = workflow(vec![step("start", StepKind::SendEmail { template_id: "tpl_1".into(), next: None })]);
    let run = row(RunStatus::Running, Some("start"));
    let mut facts = with_contact(contact(Some("ada@example.test"), json!({})));
    assert_eq!(needs(&run, &definition, &facts, &given()), Need::Template("tpl_1".into()));
    facts.templates.insert("tpl_1".into(), None);
    let tick = decided(&run, &definition, &facts, &given());
    assert_eq!(finished(&tick, "start").error_code, "template_not_found");
    assert!(tick.email.is_none() && tick.streams.is_empty());
}

#[test]
fn given_a_send_step_when_the_allowance_refused_it_then_it_is_skipped_by_the_allowance_gate() {
    let definition = workflow(vec![
        step("start", StepKind::SendEmail { template_id: "tpl_1".into(), next: next("end") }),
        step("end", StepKind::Exit),
    ]);
    let mut facts = with_contact(contact(Some("ada@example.test"), json!({})));
    facts.templates.insert("tpl_1".into(), Some(authored()));
    facts.suppressed.insert("ada@example.test".into(), false);
    let given = Given { allowance_refused: true, ..given() };
    let tick = decided(&row(RunStatus::Running, Some("start")), &definition, &facts, &given);
    let skipped = finished(&tick, "start");
    assert_eq!((skipped.status.as_str(), skipped.gate.as_str()), ("skipped", Gate::Allowance.as_str()));
    assert_eq!(skipped.next_step_id, "end");
    let (email, decided_by) = skipped_email(&tick);
    assert_eq!((email.gate.as_str(), email.code.as_str()), ("allowance", "email_limit_reached"));
    assert_eq!(decided_by, None, "a count, no event, decided");
    assert!(tick.guards.is_empty() && tick.email.is_none(), "nothing scheduled, nothing counted");
}

/// The `EmailSkipped` a tick appends, and the position of the fact that decided (if any).
fn skipped_email(tick: &Tick) -> (proto::EmailSkipped, Option<i64>) {
    assert_eq!(tick.streams.len(), 1, "one stream: the skipped email's");
    let stream = &tick.streams[0];
    let LogEvent::EmailSkipped(skipped) = &stream.events[0].event else { panic!("an EmailSkipped") };
    assert_eq!(stream.stream_id, domain::email::stream_id(&skipped.email_id));
    assert_eq!(stream.expected, ExpectedVersion::NoStream, "it begins the email's stream");
    assert_eq!(skipped.email_id, finished(tick, "start").email_id, "the step names the email");
    assert_eq!(skipped.email_id, domain::workflows::email_id("run_1", 2));
    let source = skipped.source.clone().unwrap_or_default();
    assert_eq!(
        (source.origin.as_str(), source.source_id.as_str(), source.step_id.as_str()),
        ("workflow", "run_1", "start")
    );
    assert_eq!(tick.due_ms, Some(NOW), "one effect per transition: the run goes on in the next");
    (skipped.clone(), Some(skipped.decided_by_position).filter(|position| *position > 0))
}

#[test]
fn given_an_update_step_when_a_value_changes_then_the_record_is_updated_at_its_version_and_the_transition_ends() {
    let set = BTreeMap::from([("plan".to_owned(), Source::Value(json!("pro")))]);
    let definition = workflow(vec![
        step("start", StepKind::UpdateContact { set: set.clone(), next: next("end") }),
        step("end", StepKind::Exit),
    ]);
    let run = row(RunStatus::Running, Some("start"));
    let facts = with_contact(contact(None, json!({"plan": "free"})));
    let tick = decided(&run, &definition, &facts, &given());
    assert_eq!(tick.streams.len(), 1);
    assert_eq!(tick.streams[0].expected, ExpectedVersion::Exactly(3));
    assert!(matches!(tick.streams[0].events[0].event, LogEvent::RecordUpdated(_)));
    assert_eq!((tick.row.step_id.as_deref(), tick.due_ms, tick.finished), (Some("end"), Some(NOW), false));
    // Already so: nothing written.
    let facts = with_contact(contact(None, json!({"plan": "pro"})));
    assert!(decided(&run, &definition, &facts, &given()).streams.is_empty());
}

#[test]
fn given_an_update_step_when_a_value_is_past_its_maximum_or_of_another_type_then_the_run_fails_naming_it() {
    let definition = |value: Value| {
        let set = BTreeMap::from([("plan".to_owned(), Source::Value(value))]);
        workflow(vec![step("start", StepKind::UpdateContact { set, next: next("end") }), step("end", StepKind::Exit)])
    };
    let run = row(RunStatus::Running, Some("start"));
    let facts = with_contact(contact(None, json!({"plan": "free"})));
    for (value, code) in [(json!("x".repeat(5_000)), "value_too_long"), (json!(7), "invalid_attribute_value")] {
        let tick = decided(&run, &definition(value), &facts, &given());
        assert!(tick.streams.is_empty(), "nothing written");
        assert_eq!((tick.row.status.as_str(), tick.finished), ("failed", true));
        let LogEvent::WorkflowRunFinished(ended) = tick.events.last().expect("an end") else { panic!("the run ends") };
        assert_eq!(ended.error_code, code);
        assert!(ended.error_message.contains("plan"), "{}", ended.error_message);
    }
}

#[test]
fn given_a_subscribe_step_when_the_contact_is_not_subscribed_then_a_subscription_change_is_written() {
    let subscribe =
        |topic: &str| workflow(vec![step("start", StepKind::Subscribe { topic_id: topic.into(), next: None })]);
    let run = row(RunStatus::Running, Some("start"));
    let facts = with_contact(contact(None, json!({})));
    let tick = decided(&run, &subscribe("top_offers"), &facts, &given());
    let LogEvent::SubscriptionChanged(changed) = &tick.streams[0].events[0].event else { panic!("a subscription") };
    assert_eq!(
        (changed.topic_id.as_str(), changed.status.as_str(), changed.source.as_str()),
        ("top_offers", "subscribed", "workflow")
    );
    // Already subscribed: nothing written.
    assert!(decided(&run, &subscribe("top_news"), &facts, &given()).streams.is_empty());
}

#[test]
fn given_a_call_step_when_started_then_the_attempt_is_committed_before_the_call_goes_out() {
    let definition =
        workflow(vec![step("start", StepKind::CallWebhook { url: "https://hooks.example.test/x".into(), next: None })]);
    let run = row(RunStatus::Running, Some("start"));
    let mut facts = with_contact(contact(None, json!({})));
    assert_eq!(needs(&run, &definition, &facts, &given()), Need::Secret);
    facts.secret = Some(None);
    let tick = decided(&run, &definition, &facts, &given());
    let call = tick.call.as_ref().expect("a call");
    assert_eq!(call.url, "https://hooks.example.test/x");
    assert_eq!(call.call_id, domain::workflows::call_id("run_1", 2));
    let attempt = tick.row.in_flight.as_ref().expect("in flight");
    assert_eq!((attempt.attempt, attempt.attempting), (1, true));
}

#[test]
fn given_a_call_in_flight_when_its_outcome_comes_then_it_completes_is_retried_on_schedule_or_fails() {
    let call = step("start", StepKind::CallWebhook { url: "https://hooks.example.test/x".into(), next: None });
    let definition = workflow(vec![call.clone()]);
    let facts = Facts::default();
    let delivered = CallOutcome { result: AttemptResult::Delivered { status: 200 }, body: Some(json!({"ok": true})) };
    let given_outcome = |outcome| Given { call_outcome: Some(outcome), ..given() };
    let done = decided(&in_flight(RunStatus::Running, &call, 1, true), &definition, &facts, &given_outcome(&delivered));
    assert_eq!(events(&done), ["completed start", "run completed"]);
    assert_eq!(done.outputs.get("start"), Some(&json!({"status": 200, "body": {"ok": true}})));
    let busy = CallOutcome {
        result: AttemptResult::Retryable { status: Some(503), error: "HTTP 503".into(), retry_after: None },
        body: None,
    };
    let retried = decided(&in_flight(RunStatus::Running, &call, 1, true), &definition, &facts, &given_outcome(&busy));
    assert!(retried.events.is_empty());
    assert_eq!(retried.due_ms, Some(NOW + 1000));
    assert_eq!(retried.row.in_flight.as_ref().map(|in_flight| in_flight.attempting), Some(false));
    let exhausted = decided(&in_flight(RunStatus::Running, &call, 3, true), &definition, &facts, &given_outcome(&busy));
    assert_eq!(events(&exhausted), ["failed start", "run failed"]);
    assert_eq!(finished(&exhausted, "start").error_code, "webhook_call_failed");
}

#[test]
fn given_a_call_found_going_out_without_an_outcome_when_decided_then_it_is_outcome_unknown_and_never_repeated() {
    let call = step("start", StepKind::CallWebhook { url: "https://hooks.example.test/x".into(), next: None });
    let definition = workflow(vec![call.clone()]);
    let tick = decided(&in_flight(RunStatus::Running, &call, 1, true), &definition, &Facts::default(), &given());
    assert_eq!(finished(&tick, "start").status, "outcome_unknown");
    assert!(tick.call.is_none());
}

#[test]
fn given_a_wait_for_an_event_when_it_ends_then_a_matched_event_takes_on_event_and_a_timeout_on_timeout() {
    let wait = step(
        "start",
        StepKind::WaitForEvent {
            event_schema_id: "sch_purchase".into(),
            timeout_ms: 3_600_000,
            on_event: next("thanks"),
            on_timeout: next("remind"),
        },
    );
    let definition = workflow(vec![wait.clone(), step("thanks", StepKind::Exit), step("remind", StepKind::Exit)]);
    let mut matched = in_flight(RunStatus::Sleeping, &wait, 0, false);
    matched.matched_event = Some("evt_1".into());
    let tick_matched = decided(&matched, &definition, &Facts::default(), &given());
    assert_eq!(finished(&tick_matched, "start").next_step_id, "thanks");
    assert_eq!(tick_matched.outputs.get("start"), Some(&json!({"eventId": "evt_1"})));
    let timed_out = decided(&in_flight(RunStatus::Sleeping, &wait, 0, false), &definition, &Facts::default(), &given());
    let finished_step = finished(&timed_out, "start");
    assert_eq!((finished_step.status.as_str(), finished_step.next_step_id.as_str()), ("timed_out", "remind"));
}

#[test]
fn given_a_wait_for_an_event_when_started_then_only_later_events_count() {
    let definition = workflow(vec![step(
        "start",
        StepKind::WaitForEvent {
            event_schema_id: "sch_purchase".into(),
            timeout_ms: 1000,
            on_event: None,
            on_timeout: None,
        },
    )]);
    let facts = with_contact(contact(None, json!({})));
    let tick = decided(&row(RunStatus::Running, Some("start")), &definition, &facts, &given());
    assert!(tick.new_wait);
    assert_eq!(tick.row.waiting_schema.as_deref(), Some("sch_purchase"));
    assert_eq!(tick.due_ms, Some(NOW + 1000));
}

/// A marketing template of topic `top_news` whose recipient is the context key `contact`.
fn authored() -> Authored {
    let template = json!({
        "slug": "welcome", "name": "Welcome", "kind": "marketing", "senderId": "snd_1", "topicId": "top_news",
        "subject": "Hello {{ contact.firstName }}", "html": "<p>Hello</p>", "text": "Hello",
        "recipient": "contact", "data": {"contact": {"schemaId": "sch_contacts", "schemaSlug": "contacts", "schemaType": "contact"}},
    });
    let sender = json!({"slug": "hello", "fromName": "Acme", "fromAddress": "hello@acme.test", "domainId": "dom_1"});
    let domain = json!({
        "slug": "acme", "name": "acme.test", "returnPath": "bounces.acme.test",
        "dkim": {"selector": "s1", "publicKey": "", "wrappedKey": "", "privateKey": ""},
    });
    Authored {
        template_id: "tpl_1".into(),
        revision: 1,
        template: serde_json::from_value(template).expect("a template"),
        sender_id: "snd_1".into(),
        sender: serde_json::from_value(sender).expect("a sender"),
        domain: serde_json::from_value(domain).expect("a domain"),
        topic: None,
        allowance: None,
        policy: None,
        parts: Default::default(),
        preheader: None,
    }
}

fn send_step() -> WorkflowDef {
    workflow(vec![
        step("start", StepKind::SendEmail { template_id: "tpl_1".into(), next: next("end") }),
        step("end", StepKind::Exit),
    ])
}

#[test]
fn given_a_send_step_when_the_contact_has_no_address_or_it_is_suppressed_then_the_step_is_skipped_and_the_run_goes_on()
{
    let run = row(RunStatus::Running, Some("start"));
    let mut facts = with_contact(contact(None, json!({})));
    facts.templates.insert("tpl_1".into(), Some(authored()));
    let no_address = decided(&run, &send_step(), &facts, &given());
    let skipped = finished(&no_address, "start");
    assert_eq!((skipped.status.as_str(), skipped.error_code.as_str()), ("skipped", "recipient_missing"));
    assert_eq!(skipped.next_step_id, "end");
    facts.contact = Some(contact(Some("ada@example.test"), json!({})));
    assert_eq!(needs(&run, &send_step(), &facts, &given()), Need::Suppression("ada@example.test".into()));
    facts.suppressed.insert("ada@example.test".into(), true);
    let need = Need::DecidedBy {
        gate: Gate::Suppressed,
        address: "ada@example.test".into(),
        topic_id: Some("top_news".into()),
        filled_by: None,
    };
    assert_eq!(needs(&run, &send_step(), &facts, &given()), need, "the fact that decided is asked for");
    let by = DecidedBy { position: 42, event_type: "SuppressionAdded.v1".into(), at_ms: NOW - 5_000 };
    facts.decided_by.insert(Gate::Suppressed.as_str(), Some(by));
    let suppressed = decided(&run, &send_step(), &facts, &given());
    assert_eq!(finished(&suppressed, "start").gate, Gate::Suppressed.as_str());
    let (email, decided_by) = skipped_email(&suppressed);
    assert_eq!((email.gate.as_str(), decided_by), ("suppressed", Some(42)));
    assert_eq!((email.decided_by_type.as_str(), email.decided_by_at_ms), ("SuppressionAdded.v1", NOW - 5_000));
    assert!(suppressed.email.is_none() && suppressed.guards.is_empty(), "nothing scheduled");
}

#[test]
fn given_a_send_step_when_every_gate_passes_then_the_email_is_scheduled_with_its_outbox_row_and_the_transition_ends() {
    let run = row(RunStatus::Running, Some("start"));
    let keyring = platform::crypto::Keyring::from_hex(platform::crypto::TEST_MASTER_KEY).expect("a keyring");
    let (key, _) = keyring.generate("con_1").expect("a data key");
    let mut live = contact(Some("ada@example.test"), json!({"firstName": "Ada"}));
    if let ContactFacts::Live(live) = &mut live {
        live.key = Some(key);
    }
    let mut facts = with_contact(live);
    facts.templates.insert("tpl_1".into(), Some(authored()));
    facts.suppressed.insert("ada@example.test".into(), false);
    let tick = decided(&run, &send_step(), &facts, &given());
    let email_id = domain::workflows::email_id("run_1", 2);
    assert_eq!(finished(&tick, "start").email_id, email_id);
    assert_eq!(tick.streams.len(), 1);
    assert!(matches!(tick.streams[0].events[0].event, LogEvent::EmailScheduled(_)));
    assert_eq!(tick.guards.len(), 2, "the outbox row and the marketing send a cap counts");
    assert_eq!(tick.email.as_ref().map(|prepared| prepared.parties.email_id.as_str()), Some(email_id.as_str()));
    assert_eq!((tick.row.step_id.as_deref(), tick.due_ms), (Some("end"), Some(NOW)));
    // Not subscribed to the topic: skipped by the topic gate.
    if let Some(ContactFacts::Live(live)) = &mut facts.contact {
        live.subscriptions.clear();
    }
    facts.decided_by.insert(Gate::Topic.as_str(), None);
    let unsubscribed = decided(&run, &send_step(), &facts, &given());
    assert_eq!(finished(&unsubscribed, "start").gate, Gate::Topic.as_str());
    assert_eq!(skipped_email(&unsubscribed).1, None, "never subscribed: no event decided");
}

#[test]
fn given_an_unsubscribe_step_when_the_contact_is_subscribed_then_it_is_unsubscribed() {
    let definition = workflow(vec![step("start", StepKind::Unsubscribe { topic_id: "top_news".into(), next: None })]);
    let facts = with_contact(contact(None, json!({})));
    let tick = decided(&row(RunStatus::Running, Some("start")), &definition, &facts, &given());
    let LogEvent::SubscriptionChanged(changed) = &tick.streams[0].events[0].event else { panic!("a subscription") };
    assert_eq!((changed.topic_id.as_str(), changed.status.as_str()), ("top_news", "unsubscribed"));
}

#[test]
fn given_a_run_whose_input_cannot_be_opened_when_decided_then_the_run_exits_as_erased() {
    let definition = workflow(vec![entry("end"), step("end", StepKind::Exit)]);
    let erased = Opened { input: None, outputs: BTreeMap::new() };
    let Decided::Tick(tick) =
        decide((&row(RunStatus::Running, Some("start")), &erased), &definition, &Facts::default(), &given())
            .expect("decides")
    else {
        panic!("the decision needed a fact")
    };
    assert_eq!(events(&tick), ["run exited"]);
    let LogEvent::WorkflowRunFinished(finished) = &tick.events[0] else { panic!("the run finished") };
    assert_eq!(finished.error_code, "contact_erased");
}

/// `row` with the step outputs `outputs` (sealed in the clear, as a test has no keys).
fn with_outputs(mut row: Row, outputs: Value) -> Row {
    let sealed = platform::events::seal("con_1", &proto::WorkflowStepOutput { json: outputs.to_string() });
    row.outputs = Some(prost::Message::encode_to_vec(&sealed));
    row
}

/// A journey that sends `mail`, waits up to a minute for its open, and goes to `thanks`
/// or `again`.
fn waits_for_open() -> (WorkflowDef, Step) {
    let wait = step(
        "wait",
        StepKind::WaitForEngagement {
            step: "mail".into(),
            action: EngagementAction::Opened,
            timeout_ms: 60_000,
            on_engaged: next("thanks"),
            on_timeout: next("again"),
        },
    );
    let definition = workflow(vec![
        entry("mail"),
        step("mail", StepKind::SendEmail { template_id: "tpl_1".into(), next: next("wait") }),
        wait.clone(),
        step("thanks", StepKind::Exit),
        step("again", StepKind::Exit),
    ]);
    (definition, wait)
}

fn engaged(opened: bool, clicked: bool) -> Facts {
    Facts { engagement: BTreeMap::from([("em_1".to_owned(), Engaged { opened, clicked })]), ..Facts::default() }
}

#[test]
fn given_a_wait_for_an_open_when_it_starts_then_an_earlier_open_ends_it_at_once_and_otherwise_it_sleeps_on_the_email() {
    let (definition, _) = waits_for_open();
    let run = with_outputs(row(RunStatus::Running, Some("wait")), json!({"mail": {"emailId": "em_1"}}));
    assert_eq!(needs(&run, &definition, &Facts::default(), &given()), Need::Engagement(vec!["em_1".to_owned()]));
    let tick = decided(&run, &definition, &engaged(false, true), &given());
    assert_eq!(events(&tick), ["started wait", "sleeping"], "a click is not an open");
    assert_eq!((tick.row.waiting_schema.as_deref(), tick.due_ms), (Some("opened:em_1"), Some(NOW + 60_000)));
    assert!(tick.new_wait, "the follower matches opens after this point");
    let tick = decided(&run, &definition, &engaged(true, false), &given());
    assert_eq!(events(&tick)[..2], ["started wait", "completed wait"]);
    assert_eq!(finished(&tick, "wait").next_step_id, "thanks");
    // Its send was skipped: no email to open, only the timeout ends the wait.
    let tick = decided(&row(RunStatus::Running, Some("wait")), &definition, &Facts::default(), &given());
    assert_eq!(
        (events(&tick), tick.row.waiting_schema),
        (vec!["started wait".to_owned(), "sleeping".to_owned()], None)
    );
}

#[test]
fn given_a_sleeping_wait_for_an_open_when_it_wakes_then_a_match_goes_on_engaged_and_a_timeout_asks_the_log_again() {
    let (definition, wait) = waits_for_open();
    let outputs = json!({"mail": {"emailId": "em_1"}});
    let mut matched = with_outputs(in_flight(RunStatus::Sleeping, &wait, 0, false), outputs.clone());
    matched.matched_event = Some("em_1".into());
    let tick = decided(&matched, &definition, &Facts::default(), &given());
    assert_eq!(
        (finished(&tick, "wait").status.as_str(), finished(&tick, "wait").next_step_id.as_str()),
        ("completed", "thanks")
    );
    assert_eq!(tick.outputs.get("wait"), Some(&json!({"emailId": "em_1"})));
    let due = with_outputs(in_flight(RunStatus::Sleeping, &wait, 0, false), outputs);
    assert_eq!(needs(&due, &definition, &Facts::default(), &given()), Need::Engagement(vec!["em_1".to_owned()]));
    let timed_out = decided(&due, &definition, &engaged(false, false), &given());
    assert_eq!(
        (finished(&timed_out, "wait").status.as_str(), finished(&timed_out, "wait").next_step_id.as_str()),
        ("timed_out", "again")
    );
    let missed = decided(&due, &definition, &engaged(true, false), &given());
    assert_eq!(finished(&missed, "wait").next_step_id, "thanks", "an open the follower missed still counts");
}

#[test]
fn given_a_branch_on_a_send_steps_open_when_decided_then_it_reads_what_a_person_did_with_the_email() {
    let arm = domain::workflows::Arm {
        condition: filter::parse_plain("steps.mail.opened is false").expect("parses"),
        description: "steps.mail.opened is false".into(),
        next: next("again"),
    };
    let definition = workflow(vec![
        step("start", StepKind::Branch { arms: vec![arm], default: next("thanks") }),
        step("thanks", StepKind::Exit),
        step("again", StepKind::Exit),
    ]);
    let run = with_outputs(row(RunStatus::Running, Some("start")), json!({"mail": {"emailId": "em_1"}}));
    let facts =
        |opened| Facts { engagement: engaged(opened, false).engagement, ..with_contact(contact(None, json!({}))) };
    let contact_only = with_contact(contact(None, json!({})));
    assert_eq!(needs(&run, &definition, &contact_only, &given()), Need::Engagement(vec!["em_1".to_owned()]));
    assert_eq!(finished(&decided(&run, &definition, &facts(false), &given()), "start").next_step_id, "again");
    assert_eq!(finished(&decided(&run, &definition, &facts(true), &given()), "start").next_step_id, "thanks");
}

/// Ada, with an address and a data key, and a template under a cap of one marketing email
/// a day whose outcome is `outcome`.
fn capped_facts(outcome: &str) -> Facts {
    let keyring = platform::crypto::Keyring::from_hex(platform::crypto::TEST_MASTER_KEY).expect("a keyring");
    let (key, _) = keyring.generate("con_1").expect("a data key");
    let mut live = contact(Some("ada@example.test"), json!({"firstName": "Ada"}));
    if let ContactFacts::Live(live) = &mut live {
        live.key = Some(key);
    }
    let mut facts = with_contact(live);
    let mut capped = authored();
    let policy = json!({"timeZone": {"default": "UTC"},
                        "frequencyCaps": [{"max": 1, "window": {"hours": 24}, "outcome": outcome}]});
    capped.policy = Some(serde_json::from_value(policy).expect("a policy"));
    facts.templates.insert("tpl_1".into(), Some(capped));
    facts.suppressed.insert("ada@example.test".into(), false);
    facts
}

#[test]
fn given_a_send_step_under_a_full_frequency_cap_then_it_asks_for_the_sends_and_names_the_one_that_filled_it() {
    let run = row(RunStatus::Running, Some("start"));
    let mut facts = capped_facts("skip");
    let since_ms = given().now - 86_400_000;
    assert_eq!(needs(&run, &send_step(), &facts, &given()), Need::MarketingSends { since_ms });
    facts.sent = Some(vec![mail::send::Sent { at_ms: given().now - 3_600_000, topic_id: None, position: 9, seq: 1 }]);
    let need = Need::DecidedBy {
        gate: Gate::FrequencyCap,
        address: "ada@example.test".into(),
        topic_id: Some("top_news".into()),
        filled_by: Some(9),
    };
    assert_eq!(needs(&run, &send_step(), &facts, &given()), need);
    facts.sent = Some(Vec::new());
    let sent = decided(&run, &send_step(), &facts, &given());
    assert!(sent.email.is_some(), "under the cap: scheduled");
}

#[test]
fn given_a_send_step_under_a_full_cap_whose_outcome_is_hold_then_its_email_is_stored_held_and_the_run_goes_on() {
    let run = row(RunStatus::Running, Some("start"));
    let mut facts = capped_facts("hold");
    let filled_at = given().now - 3_600_000;
    facts.sent = Some(vec![mail::send::Sent { at_ms: filled_at, topic_id: None, position: 9, seq: 1 }]);
    let tick = decided(&run, &send_step(), &facts, &given());
    assert!(tick.email.is_none(), "nothing is handed off now");
    let step = finished(&tick, "start");
    assert_eq!(step.status, "completed", "the step is done when its email is stored");
    let stream = tick.streams.iter().find(|stream| stream.stream_id.starts_with("email-")).expect("the email");
    let Some(LogEvent::EmailHeld(held)) = stream.events.get(1).map(|event| &event.event) else {
        panic!("EmailHeld follows EmailScheduled: {:?}", stream.events)
    };
    assert_eq!((held.gate.as_str(), held.not_before_ms), ("frequency_cap", filled_at + 86_400_000));
    let output = &tick.outputs["start"];
    assert_eq!((output["status"].as_str(), output["emailId"].as_str()), (Some("held"), Some(step.email_id.as_str())));
    assert!(tick.guards.iter().any(|guard| guard.sql.contains("'held'")), "its outbox row is held");
    assert!(!tick.guards.iter().any(|guard| guard.sql.contains("marketing_sends")), "not counted until released");
}

mod migration {
    use std::collections::{BTreeMap, BTreeSet};

    use domain::workflows::InFlightRule;

    use super::*;

    fn nap(id: &str, ms: i64, then: Option<&str>) -> Step {
        step(id, StepKind::Wait { wait: Wait::For { ms }, next: then.map(str::to_owned) })
    }

    fn migrate(steps: &[(&str, &str)], replan: &[&str]) -> InFlightRule {
        InFlightRule::Migrate {
            steps: steps.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect::<BTreeMap<_, _>>(),
            replan: replan.iter().map(|id| (*id).to_owned()).collect::<BTreeSet<_>>(),
        }
    }

    fn revision_2(steps: Vec<Step>, rule: InFlightRule) -> WorkflowDef {
        WorkflowDef { in_flight: rule, ..workflow(steps) }
    }

    /// `row` marked to move to revision 2 (its in-flight step, if any, its last execution).
    fn moving(row: &mut Row) -> &mut Row {
        row.migrate_to = Some(2);
        if let Some(in_flight) = &row.in_flight {
            row.step_count = in_flight.index;
        }
        row
    }

    fn given_newer(newer: &WorkflowDef) -> Given<'_> {
        Given { newer: Some((2, newer)), ..given() }
    }

    #[test]
    fn given_a_run_sleeping_in_a_mapped_wait_when_migrated_then_it_keeps_its_due_time_on_the_new_revision() {
        let old_wait = nap("three_days", 3 * 86_400_000, None);
        let old = workflow(vec![entry("three_days"), old_wait.clone()]);
        let new = revision_2(
            vec![entry("one_day"), nap("one_day", 86_400_000, Some("bye")), step("bye", StepKind::Exit)],
            migrate(&[("three_days", "one_day")], &[]),
        );
        let mut run = in_flight(RunStatus::Sleeping, &old_wait, 0, false);
        moving(&mut run);
        let tick = decided(&run, &old, &Facts::default(), &given_newer(&new));
        assert_eq!(
            events(&tick),
            ["migrated 1->2 three_days->one_day", "migrated three_days", "started one_day", "sleeping"]
        );
        assert_eq!(tick.row.revision, 2);
        assert_eq!(tick.migrated_to, Some(2));
        // The due time it had, not the new wait's length from now.
        assert_eq!(tick.due_ms, Some(NOW + 3_600_000));
        let moved = tick.row.in_flight.as_ref().expect("in flight");
        assert_eq!((moved.step_id.as_str(), moved.index, moved.started_at_ms), ("one_day", 3, NOW - 1000));
    }

    #[test]
    fn given_a_replanned_wait_when_migrated_then_it_counts_from_when_the_run_entered_and_may_end_at_once() {
        let old_wait = nap("three_days", 3 * 86_400_000, None);
        let old = workflow(vec![entry("three_days"), old_wait.clone()]);
        let new = revision_2(
            vec![entry("short"), nap("short", 500, Some("bye")), step("bye", StepKind::Exit)],
            migrate(&[("three_days", "short")], &["short"]),
        );
        let mut run = in_flight(RunStatus::Sleeping, &old_wait, 0, false);
        moving(&mut run);
        // Entered 1 s ago, now a 0.5 s wait: it ends in this transition and the run goes on.
        let tick = decided(&run, &old, &Facts::default(), &given_newer(&new));
        assert_eq!(
            events(&tick),
            [
                "migrated 1->2 three_days->short",
                "migrated three_days",
                "started short",
                "completed short",
                "started bye",
                "completed bye",
                "run exited"
            ]
        );
        let LogEvent::WorkflowRunMigrated(moved) = &tick.events[0] else { panic!("a migration first") };
        assert!(moved.replanned);
        assert_eq!(moved.until_ms, NOW - 500);
    }

    #[test]
    fn given_a_run_about_to_execute_a_step_when_migrated_then_it_executes_the_mapped_step_of_any_type() {
        let old = workflow(vec![entry("old_send"), step("old_send", StepKind::Exit)]);
        let new = revision_2(vec![entry("nap"), nap("nap", 60_000, None)], migrate(&[("old_send", "nap")], &[]));
        let mut run = row(RunStatus::Running, Some("old_send"));
        moving(&mut run);
        let tick = decided(&run, &old, &Facts::default(), &given_newer(&new));
        assert_eq!(events(&tick), ["migrated 1->2 old_send->nap", "started nap", "sleeping"]);
        assert_eq!(tick.due_ms, Some(NOW + 60_000));
    }

    #[test]
    fn given_a_run_not_started_when_migrated_then_it_starts_at_the_new_entry() {
        let old = workflow(vec![entry("a"), step("a", StepKind::Exit)]);
        let new = revision_2(vec![entry("b"), nap("b", 60_000, None)], migrate(&[], &[]));
        let mut run = row(RunStatus::Waiting, None);
        moving(&mut run);
        let tick = decided(&run, &old, &Facts::default(), &given_newer(&new));
        assert_eq!(
            events(&tick),
            ["migrated 1->2 ->", "run started", "started start", "completed start", "started b", "sleeping"]
        );
    }

    #[test]
    fn given_exit_when_a_sleeping_run_is_decided_then_its_step_and_the_run_end_exited_naming_the_revision() {
        let old_wait = nap("wait", 86_400_000, None);
        let old = workflow(vec![entry("wait"), old_wait.clone()]);
        let new = revision_2(vec![entry("wait"), old_wait.clone()], InFlightRule::Exit);
        let mut run = in_flight(RunStatus::Sleeping, &old_wait, 0, false);
        moving(&mut run);
        let tick = decided(&run, &old, &Facts::default(), &given_newer(&new));
        assert_eq!(events(&tick), ["exited wait", "run exited"]);
        let LogEvent::WorkflowRunFinished(ended) = &tick.events[1] else { panic!("the run ends") };
        assert_eq!(ended.error_code, "workflow_revised");
        assert!(ended.error_message.contains("revision 2"), "{}", ended.error_message);
        assert!(tick.finished);
        assert_eq!(tick.row.revision, 1, "an exited run ends on its own revision");
    }

    #[test]
    fn given_exit_when_a_run_that_has_not_started_is_decided_then_it_starts_on_the_new_revision() {
        let old = workflow(vec![entry("a"), step("a", StepKind::Exit)]);
        let new = revision_2(vec![entry("b"), nap("b", 60_000, None)], InFlightRule::Exit);
        let mut run = row(RunStatus::Waiting, None);
        run.step_count = 0;
        moving(&mut run);
        let tick = decided(&run, &old, &Facts::default(), &given_newer(&new));
        assert_eq!(
            events(&tick),
            ["migrated 1->2 ->", "run started", "started start", "completed start", "started b", "sleeping"]
        );
        assert_eq!(tick.row.revision, 2);
    }

    #[test]
    fn given_a_migration_whose_wait_ends_into_a_send_the_allowance_refused_then_the_send_is_skipped() {
        let old_wait = nap("nap", 3_600_000, None);
        let old = workflow(vec![entry("nap"), old_wait.clone()]);
        let send = step("mail", StepKind::SendEmail { template_id: "tpl_1".into(), next: None });
        let new = revision_2(
            vec![entry("short"), nap("short", 500, Some("mail")), send],
            migrate(&[("nap", "short")], &["short"]),
        );
        let mut run = in_flight(RunStatus::Sleeping, &old_wait, 0, false);
        moving(&mut run);
        let mut facts = with_contact(contact(Some("ada@example.test"), json!({})));
        facts.templates.insert("tpl_1".into(), Some(authored()));
        facts.suppressed.insert("ada@example.test".into(), false);
        let given = Given { allowance_refused: true, ..given_newer(&new) };
        let tick = decided(&run, &old, &facts, &given);
        assert!(events(&tick).contains(&"skipped mail".to_owned()), "{:?}", events(&tick));
        assert_eq!(tick.row.revision, 2);
    }

    #[test]
    fn given_a_step_with_no_place_when_decided_then_the_run_stays_on_its_revision_and_sleeps_on() {
        let old_wait = nap("gone", 86_400_000, None);
        let old = workflow(vec![entry("gone"), old_wait.clone()]);
        let new = revision_2(vec![entry("other"), nap("other", 1000, None)], migrate(&[], &[]));
        let mut run = in_flight(RunStatus::Sleeping, &old_wait, 0, false);
        moving(&mut run);
        let tick = decided(&run, &old, &Facts::default(), &given_newer(&new));
        assert!(tick.events.is_empty(), "{:?}", events(&tick));
        assert_eq!((tick.row.revision, tick.migrated_to, tick.due_ms), (1, Some(2), Some(NOW + 3_600_000)));
    }

    #[test]
    fn given_a_call_whose_outcome_just_came_when_decided_then_the_move_waits_for_the_next_transition() {
        let call = step("call", StepKind::CallWebhook { url: "https://hooks.example.test/x".into(), next: None });
        let old = workflow(vec![entry("call"), call.clone()]);
        let new = revision_2(vec![entry("call"), call.clone()], InFlightRule::Exit);
        let mut run = in_flight(RunStatus::Running, &call, 1, true);
        moving(&mut run);
        let outcome = CallOutcome { result: AttemptResult::Delivered { status: 200 }, body: None };
        let given = Given { call_outcome: Some(&outcome), ..given_newer(&new) };
        let tick = decided(&run, &old, &Facts::default(), &given);
        assert!(!events(&tick).iter().any(|event| event.starts_with("run exited")), "{:?}", events(&tick));
        assert_eq!(tick.migrated_to, None);
    }
}
