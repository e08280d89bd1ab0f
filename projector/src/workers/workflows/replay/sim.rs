//! The replay's runs: what the follower and the engine would have done with each item of the
//! log, on the log's clock, with the engine's own decision.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use deadpool_postgres::GenericClient;
use domain::workflows::{ContactRuns, Reentry, StepKind, TriggerOn};
use platform::events::LogEvent;
use platform::proto;
use serde_json::{Value, json};

use super::store::Store;
use super::{NEEDS_MAX, Report, Request};
use crate::workers::outbound::AttemptResult;
use journeys::decide::{CallOutcome, ContactFacts, Decided, Engaged, Given, Opened, Row, RunStatus, Tick, decide};

/// Something at a position of the log.
pub(super) struct Item {
    pub(super) position: i64,
    pub(super) at: i64,
    pub(super) what: What,
}

pub(super) enum What {
    Logged(Box<LogEvent>),
    Entered { segment_id: String, contact_id: String, reentry: Reentry },
}

/// The event schemas `definition` follows: its triggers' and its `wait_for_event` steps'.
fn followed(definition: &domain::workflows::WorkflowDef) -> HashSet<String> {
    let triggers = definition.triggers.iter().filter_map(|trigger| match &trigger.on {
        TriggerOn::Event { event_schema_id } => Some(event_schema_id.clone()),
        TriggerOn::Segment { .. } => None,
    });
    let waits = definition.steps.iter().filter_map(|step| match &step.kind {
        StepKind::WaitForEvent { event_schema_id, .. } => Some(event_schema_id.clone()),
        _ => None,
    });
    triggers.chain(waits).collect()
}

/// What a batch of the log needs read: data keys, and the acceptances of the events it finds
/// ready later, by event id.
pub(super) struct Batch {
    keys: platform::crypto::Keys,
    accepted: HashMap<String, proto::EventAccepted>,
}

/// An event's values (its acceptance's, then what its preparation added), opened.
fn values(sealed: &[Option<&proto::Sealed>], keys: &platform::crypto::Keys) -> anyhow::Result<Value> {
    let mut values = serde_json::Map::new();
    for sealed in sealed {
        let opened: Option<proto::EventData> = platform::events::open(*sealed, keys)?;
        if let Some(Value::Object(more)) = opened.and_then(|data| serde_json::from_str(&data.values_json).ok()) {
            values.extend(more);
        }
    }
    Ok(Value::Object(values))
}

/// A run of the replay: its row as the engine keeps it, its opened data, and what the engine's
/// row has besides.
struct SimRun {
    row: Row,
    opened: Opened,
    /// The log position when its `wait_for_event` began (only later events end it).
    waiting_after: i64,
    /// Its entry in the timers.
    timer: Option<(i64, u64)>,
}

pub(super) struct Sim<'a> {
    request: &'a Request<'a>,
    site: &'a mail::send::Site,
    retry_schedule_ms: &'a [u64],
    /// The event schemas the definition follows: its triggers' and its `wait_for_event`
    /// steps'. Other events are passed over.
    followed: HashSet<String>,
    runs: HashMap<String, SimRun>,
    /// Due runs: (due, order of scheduling, run).
    timers: BTreeSet<(i64, u64, String)>,
    /// Each contact's open runs.
    by_contact: HashMap<String, Vec<String>>,
    /// Contacts that had a run (re-entry `once`).
    entered_once: HashSet<String>,
    /// The emails the replay scheduled, with what a person did with them since.
    emails: HashMap<String, Engaged>,
    /// The replay's marketing sends by contact: (email, the send as caps count it).
    sim_sent: HashMap<String, Vec<(String, mail::send::Sent)>>,
    /// The position of the last item handled.
    pub(super) position: i64,
    seq: u64,
    report: Report,
    store: Store,
}

impl<'a> Sim<'a> {
    pub(super) fn new(
        request: &'a Request<'a>,
        (site, retry_schedule_ms): (&'a mail::send::Site, &'a [u64]),
        position: i64,
    ) -> Self {
        Sim {
            request,
            site,
            retry_schedule_ms,
            followed: followed(request.definition),
            runs: HashMap::new(),
            timers: BTreeSet::new(),
            by_contact: HashMap::new(),
            entered_once: HashSet::new(),
            emails: HashMap::new(),
            sim_sent: HashMap::new(),
            position,
            seq: 0,
            report: Report {
                from: platform::time::format_millis(request.from_ms),
                to: platform::time::format_millis(request.to_ms),
                ..Report::default()
            },
            store: Store::new(),
        }
    }

    /// Counts the log's events read.
    pub(super) fn read(&mut self, events: usize) {
        self.report.events_read += events as u64;
    }

    /// The report, with the runs still open counted by the step they are in.
    pub(super) fn finish(mut self) -> Report {
        for run in self.runs.values() {
            let step = match (&run.row.in_flight, &run.row.step_id, run.row.status) {
                (_, _, RunStatus::Waiting) => "notStarted".to_owned(),
                (Some(in_flight), _, _) => in_flight.step_id.clone(),
                (None, Some(step_id), _) => step_id.clone(),
                (None, None, _) => self.request.definition.entry.clone(),
            };
            *self.report.at_step.entry(step).or_default() += 1;
        }
        self.report
    }

    /// Reads, for a batch, the contacts its triggers start runs for, the data keys that open
    /// its events' values and runs' inputs, and the acceptances of the events it finds ready
    /// later (their contact and first values), all set-wise.
    pub(super) async fn prepare(&mut self, client: &impl GenericClient, items: &[Item]) -> anyhow::Result<Batch> {
        let mut contacts = BTreeSet::new();
        let mut subjects = BTreeSet::new();
        let mut later = Vec::new();
        for item in items {
            let event = match &item.what {
                What::Logged(event) => &**event,
                What::Entered { contact_id, .. } => {
                    contacts.insert(contact_id.clone());
                    subjects.insert(contact_id.clone());
                    continue;
                }
            };
            match event {
                LogEvent::EventAccepted(accepted) if self.triggered(&accepted.schema_id).is_some() => {
                    contacts.insert(accepted.contact_id.clone());
                    subjects.insert(accepted.contact_id.clone());
                }
                LogEvent::EventReadinessChanged(changed)
                    if changed.state == "ready" && self.followed.contains(&changed.schema_id) =>
                {
                    later.push(domain::business_events::stream_id(&changed.id));
                }
                LogEvent::WorkflowRunRequested(requested) if requested.workflow_id == self.request.workflow_id => {
                    let subject = match requested.contact_id.is_empty() {
                        true => requested.run_id.clone(),
                        false => requested.contact_id.clone(),
                    };
                    contacts.insert(requested.contact_id.clone());
                    subjects.insert(subject);
                }
                _ => {}
            }
        }
        let mut accepted = HashMap::new();
        for stored in platform::log::read_streams(client, &later).await? {
            if let LogEvent::EventAccepted(event) = stored.decode()?
                && !event.contact_id.is_empty()
            {
                subjects.insert(event.contact_id.clone());
                if self.triggered(&event.schema_id).is_some() {
                    contacts.insert(event.contact_id.clone());
                }
                accepted.insert(event.id.clone(), event);
            }
        }
        contacts.remove("");
        let missing: Vec<String> =
            contacts.into_iter().filter(|contact_id| !self.store.contacts.contains_key(contact_id)).collect();
        self.store.load_contacts(client, &missing).await?;
        let subjects: Vec<String> = subjects.into_iter().collect();
        Ok(Batch { keys: platform::crypto::load_keys(client, &subjects).await?, accepted })
    }

    /// The definition's trigger on events of `schema_id`, if it has one.
    fn triggered(&self, schema_id: &str) -> Option<Reentry> {
        self.request.definition.triggers.iter().find_map(|trigger| match &trigger.on {
            TriggerOn::Event { event_schema_id } if event_schema_id == schema_id => Some(trigger.reentry),
            _ => None,
        })
    }

    /// What an item of the log means for the replay's runs.
    pub(super) fn handle(&mut self, item: Item, batch: &Batch) -> anyhow::Result<()> {
        let (position, at, keys) = (item.position, item.at, &batch.keys);
        let event = match item.what {
            What::Logged(event) => *event,
            What::Entered { segment_id, contact_id, reentry } => {
                if keys.get(&contact_id).is_none() || self.held_back(&contact_id, reentry) {
                    return Ok(());
                }
                let cause = format!(
                    "workflow-segment\u{1f}{}\u{1f}{segment_id}\u{1f}{contact_id}\u{1f}{position}",
                    self.request.workflow_id
                );
                let run_id = format!("run_{}", &platform::ids::sha256_hex(&cause)[..32]);
                self.start(run_id, Some(contact_id), json!({"segment": {"id": segment_id}}), at);
                return Ok(());
            }
        };
        match event {
            LogEvent::EventAccepted(accepted)
                if accepted.readiness == "ready"
                    && !accepted.contact_id.is_empty()
                    && self.followed.contains(&accepted.schema_id) =>
            {
                let event = (accepted.id.as_str(), accepted.schema_id.as_str());
                self.ready(&accepted.contact_id, event, (position, at), keys, || {
                    let data = values(&[accepted.data.as_ref()], keys)?;
                    Ok((data, Some(platform::time::format_millis(accepted.occurred_at_ms))))
                })?;
            }
            LogEvent::EventReadinessChanged(changed) if changed.state == "ready" => {
                // Its acceptance, read with the batch (none: not an event a journey follows).
                let Some(first) = batch.accepted.get(&changed.id) else { return Ok(()) };
                let event = (changed.id.as_str(), changed.schema_id.as_str());
                self.ready(&first.contact_id, event, (position, at), keys, || {
                    let data = values(&[first.data.as_ref(), changed.prepared.as_ref()], keys)?;
                    Ok((data, Some(platform::time::format_millis(first.occurred_at_ms))))
                })?;
            }
            LogEvent::RecordDeletionRequested(requested) if requested.schema_type == "contact" => {
                // From here on the contact is gone; its runs end at their next step.
                self.store.contacts.insert(requested.record_id.clone(), ContactFacts::Gone);
                for run_id in self.by_contact.get(&requested.record_id).cloned().unwrap_or_default() {
                    self.wake(&run_id, at, None);
                }
            }
            LogEvent::EmailOpened(opened) if opened.machine.is_empty() => {
                self.engaged(&opened.contact_id, &opened.email_id, domain::workflows::EngagementAction::Opened, at);
            }
            LogEvent::EmailClicked(clicked) if clicked.machine.is_empty() => {
                self.engaged(&clicked.contact_id, &clicked.email_id, domain::workflows::EngagementAction::Clicked, at);
            }
            LogEvent::WorkflowRunRequested(requested)
                if requested.workflow_id == self.request.workflow_id
                    && !matches!(requested.trigger.as_str(), "event" | "segment") =>
            {
                let input: Option<proto::WorkflowInput> = platform::events::open(requested.input.as_ref(), keys)?;
                let Some(input) = input.and_then(|input| serde_json::from_str::<Value>(&input.json).ok()) else {
                    return Ok(());
                };
                let contact_id = Some(requested.contact_id).filter(|id| !id.is_empty());
                self.start(requested.run_id, contact_id, input, at);
            }
            _ => {}
        }
        Ok(())
    }

    /// An event ready for a contact: it starts a run of the trigger on its schema (its values,
    /// opened only then) and ends the waits for it.
    fn ready(
        &mut self,
        contact_id: &str,
        (event_id, schema_id): (&str, &str),
        (position, at): (i64, i64),
        keys: &platform::crypto::Keys,
        data: impl FnOnce() -> anyhow::Result<(Value, Option<String>)>,
    ) -> anyhow::Result<()> {
        if let Some(reentry) = self.triggered(schema_id)
            && keys.get(contact_id).is_some()
            && !self.held_back(contact_id, reentry)
        {
            let (data, occurred_at) = data()?;
            let cause = format!("workflow-trigger\u{1f}{}\u{1f}{event_id}", self.request.workflow_id);
            let run_id = format!("run_{}", &platform::ids::sha256_hex(&cause)[..32]);
            let input =
                json!({"event": {"id": event_id, "schemaId": schema_id, "occurredAt": occurred_at, "data": data}});
            self.start(run_id, Some(contact_id.to_owned()), input, at);
        }
        self.wake_waiting(contact_id, schema_id, event_id, (position, at));
        Ok(())
    }

    /// A person's open or click of an email the replay scheduled.
    fn engaged(&mut self, contact_id: &str, email_id: &str, action: domain::workflows::EngagementAction, at: i64) {
        let Some(engaged) = self.emails.get_mut(email_id) else { return };
        match action {
            domain::workflows::EngagementAction::Opened => engaged.opened = true,
            domain::workflows::EngagementAction::Clicked => engaged.clicked = true,
        }
        let waiting = action.waiting_key(email_id);
        self.wake_waiting(contact_id, &waiting, email_id, (self.position, at));
    }

    /// Ends the waits of `contact_id`'s runs for `waiting` that began before `position`.
    fn wake_waiting(&mut self, contact_id: &str, waiting: &str, matched: &str, (position, at): (i64, i64)) {
        let waiting_runs: Vec<String> = self
            .by_contact
            .get(contact_id)
            .into_iter()
            .flatten()
            .filter(|run_id| {
                self.runs.get(*run_id).is_some_and(|run| {
                    run.row.status == RunStatus::Sleeping
                        && run.row.waiting_schema.as_deref() == Some(waiting)
                        && run.row.matched_event.is_none()
                        && run.waiting_after < position
                })
            })
            .cloned()
            .collect();
        for run_id in waiting_runs {
            self.wake(&run_id, at, Some(matched));
        }
    }

    /// Makes a run due at `at` (with what ended its wait).
    fn wake(&mut self, run_id: &str, at: i64, matched: Option<&str>) {
        let Some(run) = self.runs.get_mut(run_id) else { return };
        if let Some(matched) = matched {
            run.row.matched_event = Some(matched.to_owned());
        }
        if let Some((due, seq)) = run.timer.take() {
            self.timers.remove(&(due, seq, run_id.to_owned()));
        }
        self.seq += 1;
        run.timer = Some((at, self.seq));
        self.timers.insert((at, self.seq, run_id.to_owned()));
    }

    fn held_back(&mut self, contact_id: &str, reentry: Reentry) -> bool {
        let runs = ContactRuns {
            any: self.entered_once.contains(contact_id),
            unfinished: self.by_contact.get(contact_id).is_some_and(|runs| !runs.is_empty()),
        };
        let held = reentry.holds_back(runs);
        self.report.held_back += u64::from(held);
        held
    }

    fn start(&mut self, run_id: String, contact_id: Option<String>, input: Value, at: i64) {
        if self.runs.contains_key(&run_id) {
            return;
        }
        self.report.entered += 1;
        if let Some(contact_id) = &contact_id {
            self.entered_once.insert(contact_id.clone());
            self.by_contact.entry(contact_id.clone()).or_default().push(run_id.clone());
        }
        let row = Row::requested(&run_id, self.request.workflow_id, self.request.space_id, contact_id);
        let opened = Opened { input: Some(input), outputs: BTreeMap::new() };
        self.runs.insert(run_id.clone(), SimRun { row, opened, waiting_after: 0, timer: None });
        self.report.peak_open = self.report.peak_open.max(self.runs.len() as u64);
        self.wake(&run_id, at, None);
    }

    /// Advances every run due by `until`, each at its due time, in order.
    pub(super) async fn fire_until(&mut self, client: &impl GenericClient, until: i64) -> anyhow::Result<()> {
        while let Some((due, seq, run_id)) = self.timers.first().cloned()
            && due <= until
        {
            self.timers.remove(&(due, seq, run_id.clone()));
            if let Some(run) = self.runs.get_mut(&run_id) {
                run.timer = None;
            }
            self.advance(client, &run_id, due).await?;
        }
        Ok(())
    }

    /// Advances a run by one transition (two around a webhook call), at `now`.
    async fn advance(&mut self, client: &impl GenericClient, run_id: &str, now: i64) -> anyhow::Result<()> {
        let Some(mut run) = self.runs.remove(run_id) else { return Ok(()) };
        let mut outcome: Option<CallOutcome> = None;
        loop {
            let given = Given {
                now,
                jitter: 1.0,
                allowance_refused: false,
                call_outcome: outcome.as_ref(),
                retry_schedule_ms: self.retry_schedule_ms,
                site: self.site,
                newer: None,
            };
            let contact_id = run.row.contact_id.clone().unwrap_or_default();
            self.store.facts.engagement.clear();
            self.store.facts.decided_by.clear();
            self.store.facts.sent = None;
            self.store.facts.contact = None;
            let mut tick = None;
            for _ in 0..NEEDS_MAX {
                match decide((&run.row, &run.opened), self.request.definition, &self.store.facts, &given)? {
                    Decided::Tick(decided) => {
                        tick = Some(*decided);
                        break;
                    }
                    Decided::Needs(need) => {
                        let sent = self.sim_sent.get(&contact_id).map(Vec::as_slice).unwrap_or_default();
                        self.store.load(client, (self.request, &run.row, now), need, (&self.emails, sent)).await?;
                    }
                }
            }
            let Some(mut tick) = tick else {
                anyhow::bail!("run {run_id}: its decision kept asking for facts");
            };
            self.count(&tick, now);
            let called = tick.call.take().is_some();
            let version = tick.base_version + tick.events.len() as i64;
            run.row = tick.row;
            run.row.version = version;
            if let Some(in_flight) = &mut run.row.in_flight {
                in_flight.until_ms = tick.due_ms.or(in_flight.until_ms);
            }
            if tick.new_wait {
                run.waiting_after = self.position;
                run.row.matched_event = None;
            } else if run.row.waiting_schema.is_none() {
                run.row.matched_event = None;
            }
            run.opened.outputs = std::mem::take(&mut tick.outputs);
            outcome = called.then_some(CallOutcome { result: AttemptResult::Delivered { status: 200 }, body: None });
            if called {
                self.report.calls += 1;
                continue;
            }
            if tick.finished {
                if let Some(runs) =
                    run.row.contact_id.as_ref().and_then(|contact_id| self.by_contact.get_mut(contact_id))
                {
                    runs.retain(|id| id != run_id);
                }
                return Ok(());
            }
            if let Some(due) = tick.due_ms {
                self.seq += 1;
                run.timer = Some((due, self.seq));
                self.timers.insert((due, self.seq, run_id.to_owned()));
            }
            self.runs.insert(run_id.to_owned(), run);
            return Ok(());
        }
    }

    /// Counts what a transition did.
    fn count(&mut self, tick: &Tick, now: i64) {
        let report = &mut self.report;
        for event in &tick.events {
            match event {
                LogEvent::WorkflowStepStarted(started) => {
                    report.steps.entry(started.step_id.clone()).or_default().started += 1;
                }
                LogEvent::WorkflowStepFinished(finished) => {
                    let step = report.steps.entry(finished.step_id.clone()).or_default();
                    match finished.status.as_str() {
                        "completed" => step.completed += 1,
                        "skipped" => {
                            step.skipped += 1;
                            let gate = if finished.gate.is_empty() { &finished.error_code } else { &finished.gate };
                            *report.skips.entry(gate.clone()).or_default() += 1;
                        }
                        "failed" => step.failed += 1,
                        _ => {}
                    }
                    if finished.status == "completed" && !finished.email_id.is_empty() {
                        let held = tick
                            .outputs
                            .get(&finished.step_id)
                            .and_then(|output| output.get("status"))
                            .is_some_and(|status| status == "held");
                        if held {
                            report.held += 1;
                        } else {
                            report.sends += 1;
                        }
                        self.emails.insert(finished.email_id.clone(), Engaged::default());
                        let marketing =
                            self.request.definition.step(&finished.step_id).and_then(|step| match &step.kind {
                                StepKind::SendEmail { template_id, .. } => self.store.facts.templates.get(template_id),
                                _ => None,
                            });
                        if let (Some(Some(authored)), Some(contact_id)) = (marketing, &tick.row.contact_id)
                            && authored.template.kind == "marketing"
                        {
                            let sent = mail::send::Sent {
                                at_ms: held_until(tick, &finished.step_id).unwrap_or(now),
                                topic_id: authored.template.topic_id.clone(),
                                position: 0,
                                seq: 0,
                            };
                            self.sim_sent
                                .entry(contact_id.clone())
                                .or_default()
                                .push((finished.email_id.clone(), sent));
                        }
                    }
                }
                LogEvent::WorkflowRunFinished(finished) => match finished.status.as_str() {
                    "completed" => report.completed += 1,
                    "exited" => report.exited += 1,
                    _ => report.failed += 1,
                },
                _ => {}
            }
        }
    }
}

/// When a held email of the transition's step goes out.
fn held_until(tick: &Tick, step_id: &str) -> Option<i64> {
    let not_before = tick.outputs.get(step_id)?.get("notBefore")?.as_str()?;
    chrono::DateTime::parse_from_rfc3339(not_before).ok().map(|at| at.timestamp_millis())
}
