//! The workflows of a space, checked and with their references resolved to ids, become the
//! definitions the catalog holds (`domain::workflows::WorkflowDef`). The format is in
//! `docs/workspace-file.md` ("Workflows"). Every refusal names the workflow and the step.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, bail};
use domain::workflows::{
    Arm, InFlightRule, Reentry, Source, Status, Step, StepKind, StoredSecret, Trigger, TriggerOn, WORKFLOW, Wait,
    WorkflowDef, check, parse_duration,
};
use filter::{CONSENT_EMAIL, FieldPath, Filter};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::email::{Schemas, resource_id};
use super::format::{ResourceSpec, SpaceSpec};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WorkflowSpec {
    name: String,
    #[serde(default = "published")]
    status: String,
    /// The contact schema's slug (default: the space's only contact schema).
    #[serde(default)]
    contact_schema: Option<String>,
    /// `whsec_` and base64 of the secret `call_webhook` steps sign with (default: one is
    /// generated at the first apply and printed once).
    #[serde(default)]
    signing_secret: Option<String>,
    #[serde(default)]
    triggers: Vec<TriggerSpec>,
    steps: Vec<Map<String, Value>>,
    /// What publishing a new revision does with the runs in flight (default `pin`).
    #[serde(default)]
    in_flight: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MigrateSpec {
    #[serde(default)]
    steps: BTreeMap<String, String>,
    #[serde(default)]
    replan: BTreeSet<String>,
}

/// `inFlight`: `"pin"`, `"exit"` or `{"migrate": {"steps": {<old>: <new>}, "replan": [<new wait>]}}`.
fn in_flight_rule(value: Option<Value>) -> anyhow::Result<InFlightRule> {
    const SHAPE: &str = "inFlight must be \"pin\", \"exit\" or {\"migrate\": {\"steps\": {<old step>: <new step>}, \"replan\": [<wait step>]}}";
    Ok(match value {
        None => InFlightRule::Pin,
        Some(Value::String(text)) if text == "pin" => InFlightRule::Pin,
        Some(Value::String(text)) if text == "exit" => InFlightRule::Exit,
        Some(Value::Object(mut map)) if map.len() == 1 && map.contains_key("migrate") => {
            let spec: MigrateSpec =
                serde_json::from_value(map.remove("migrate").unwrap_or_default()).with_context(|| SHAPE)?;
            InFlightRule::Migrate { steps: spec.steps, replan: spec.replan }
        }
        Some(_) => bail!(SHAPE),
    })
}

fn published() -> String {
    "published".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TriggerSpec {
    /// An event schema's slug.
    #[serde(default)]
    event: Option<String>,
    /// A segment's id.
    #[serde(default)]
    segment: Option<String>,
    #[serde(default = "always")]
    reentry: String,
}

fn always() -> String {
    "always".to_owned()
}

/// What a workflow may name elsewhere in the space.
pub(super) struct Names<'a> {
    pub schemas: Schemas<'a>,
    pub templates: BTreeMap<&'a str, String>,
    pub topics: BTreeMap<&'a str, String>,
    /// Live segments of the space (made through the API).
    pub segments: BTreeSet<String>,
}

/// A generated signing secret to show once: `(workflow id, secret)`.
pub(super) type Generated = (String, String);

/// The workflows' definitions as `(id, JSON)`, and the secrets generated for them.
pub(super) type Definitions = (Vec<(String, Value)>, Vec<Generated>);

/// The definitions (id, JSON) of a space's workflows. `previous` answers a workflow's current
/// definition, to keep its signing secret.
pub(super) fn definitions(
    space: &SpaceSpec,
    names: &Names<'_>,
    previous: impl Fn(&str) -> Option<Value>,
) -> anyhow::Result<Definitions> {
    let mut out = Vec::new();
    let mut generated = Vec::new();
    let mut references = BTreeSet::new();
    for resource in &space.workflows {
        let id = resource_id(WORKFLOW, "wf", &space.slug, resource);
        let owner = format!("workflow {:?}", resource.slug);
        let spec: WorkflowSpec = serde_json::from_value(Value::Object(resource.fields.clone()))
            .with_context(|| format!("{owner} is not valid"))?;
        let kept: Option<WorkflowDef> = previous(&id).and_then(|definition| serde_json::from_value(definition).ok());
        let (definition, secret) =
            definition(resource, &id, spec, names, kept.as_ref()).with_context(|| format!("{owner} is not valid"))?;
        if !references.insert(definition.reference_id.clone()) {
            bail!("{owner}: referenceId {:?} is used by another workflow of the space", definition.reference_id);
        }
        generated.extend(secret.map(|secret| (id.clone(), secret)));
        out.push((id, serde_json::to_value(definition)?));
    }
    Ok((out, generated))
}

fn definition(
    resource: &ResourceSpec,
    id: &str,
    spec: WorkflowSpec,
    names: &Names<'_>,
    kept: Option<&WorkflowDef>,
) -> anyhow::Result<(WorkflowDef, Option<String>)> {
    let status = match spec.status.as_str() {
        "published" => Status::Published,
        "draft" => Status::Draft,
        other => bail!("status {other:?} is not published or draft"),
    };
    let mut contact_schemas = names.schemas.by_slug.iter().filter(|(_, (_, kind, _))| *kind == "contact");
    let (contact_slug, (contact_schema_id, _, attributes)) = match &spec.contact_schema {
        Some(slug) => match names.schemas.by_slug.get_key_value(slug.as_str()) {
            Some((slug, schema @ (_, "contact", _))) => (*slug, schema),
            _ => bail!("contactSchema {slug:?} is not a contact schema of the space"),
        },
        None => match (contact_schemas.next(), contact_schemas.next()) {
            (Some((slug, schema)), None) => (*slug, schema),
            _ => bail!("the space has several contact schemas (or none): name one in contactSchema"),
        },
    };
    let (contact_schema_id, attributes) = (contact_schema_id.clone(), attributes.clone());
    let definitions = names.schemas.attributes.get(contact_slug).map(Vec::as_slice).unwrap_or_default();
    let resolver = Resolver { names, attributes: &attributes, definitions };
    let mut steps = Vec::new();
    let ids: Vec<String> = spec
        .steps
        .iter()
        .enumerate()
        .map(|(index, step)| {
            step.get("id").and_then(Value::as_str).map_or(format!("step-{}", index + 1), str::to_owned)
        })
        .collect();
    for (index, fields) in spec.steps.iter().enumerate() {
        let following = ids.get(index + 1).cloned();
        let step = resolver.step(&ids[index], fields, following).with_context(|| format!("step {:?}", ids[index]))?;
        steps.push(step);
    }
    let step_ids: BTreeSet<&str> = steps.iter().map(|step| step.id.as_str()).collect();
    for step in &steps {
        if let StepKind::Branch { arms, .. } = &step.kind {
            for arm in arms {
                resolver
                    .check_step_references(&arm.condition, &step_ids)
                    .with_context(|| format!("step {:?}: condition {:?}", step.id, arm.description))?;
            }
        }
    }
    let (entry, reference_id) = steps
        .iter()
        .find_map(|step| match &step.kind {
            StepKind::IncomingWebhook { reference_id, .. } => Some((step.id.clone(), reference_id.clone())),
            _ => None,
        })
        .unwrap_or_default();
    let triggers = spec
        .triggers
        .iter()
        .map(|trigger| {
            let on = match (&trigger.event, &trigger.segment) {
                (Some(event), None) => TriggerOn::Event { event_schema_id: resolver.event_schema(event)? },
                (None, Some(segment)) => {
                    if !resolver.names.segments.contains(segment) {
                        bail!("trigger: segment {segment:?} is not a segment of the space");
                    }
                    TriggerOn::Segment { segment_id: segment.clone() }
                }
                _ => bail!("a trigger names either an event (an event schema's slug) or a segment (its id)"),
            };
            let reentry = match trigger.reentry.as_str() {
                "always" => Reentry::Always,
                "once" => Reentry::Once,
                "once_at_a_time" => Reentry::OnceAtATime,
                other => bail!("trigger reentry {other:?} is not always, once or once_at_a_time"),
            };
            Ok(Trigger { on, reentry })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let calls = steps.iter().any(|step| matches!(step.kind, StepKind::CallWebhook { .. }));
    let (signing, generated) = signing(id, spec.signing_secret.as_deref(), calls, kept)?;
    let definition = WorkflowDef {
        slug: resource.slug.clone(),
        name: spec.name,
        status,
        contact_schema_id,
        entry,
        reference_id,
        steps,
        triggers,
        signing,
        in_flight: in_flight_rule(spec.in_flight)?,
    };
    check(&definition)?;
    Ok((definition, generated))
}

/// The signing secret to keep: the given one (sealed), the one kept from the last apply, or a
/// new one when the workflow calls webhooks (answered to be shown once).
fn signing(
    workflow_id: &str,
    given: Option<&str>,
    calls: bool,
    kept: Option<&WorkflowDef>,
) -> anyhow::Result<(Option<StoredSecret>, Option<String>)> {
    let kept = kept.and_then(|kept| kept.signing.clone());
    let keyring = platform::crypto::keyring()?;
    let subject = domain::workflows::secret_subject(workflow_id);
    let seal = |secret: &str| -> anyhow::Result<StoredSecret> {
        let (key, wrapped) = keyring.generate(&subject)?;
        domain::workflows::seal_secret(&key, &wrapped, workflow_id, secret)
    };
    let open = |stored: &StoredSecret| -> anyhow::Result<String> {
        let key = keyring.unwrap_key(&subject, &domain::workflows::wrapped_key(stored)?)?;
        domain::workflows::open_secret(&key, workflow_id, stored)
    };
    match given {
        Some(secret) => {
            domain::webhooks::signing::Secret::parse(secret)
                .with_context(|| "signingSecret must be whsec_ and the base64 of 24 to 64 bytes")?;
            if let Some(kept) = &kept
                && open(kept).ok().as_deref() == Some(secret)
            {
                return Ok((Some(kept.clone()), None));
            }
            Ok((Some(seal(secret)?), None))
        }
        None if kept.is_some() => Ok((kept, None)),
        None if calls => {
            let secret = domain::webhooks::signing::Secret::from_random(platform::crypto::random_bytes()).reveal();
            Ok((Some(seal(&secret)?), Some(secret)))
        }
        None => Ok((None, None)),
    }
}

struct Resolver<'a> {
    names: &'a Names<'a>,
    /// The contact schema's attribute keys.
    attributes: &'a [&'a str],
    /// The contact schema's attributes with their definitions.
    definitions: &'a [domain::catalog::AttributeEntry],
}

/// The fields of a step beside its type and id, as authored.
fn fields_of<T: serde::de::DeserializeOwned>(fields: &Map<String, Value>) -> anyhow::Result<T> {
    let mut fields = fields.clone();
    fields.remove("id");
    fields.remove("type");
    Ok(serde_json::from_value(Value::Object(fields))?)
}

/// `next` as authored: absent is the following step in the list, null ends the run.
fn next_of(fields: &Map<String, Value>, following: &Option<String>) -> anyhow::Result<Option<String>> {
    match fields.get("next") {
        None => Ok(following.clone()),
        Some(Value::Null) => Ok(None),
        Some(Value::String(next)) => Ok(Some(next.clone())),
        Some(_) => bail!("next must be a step id or null"),
    }
}

fn optional_step(value: Option<String>) -> Option<String> {
    value.filter(|id| !id.is_empty())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EntrySpec {
    reference_id: String,
    #[serde(default)]
    #[allow(dead_code, reason = "read through next_of")]
    next: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WaitSpec {
    #[serde(default)]
    duration: Option<String>,
    /// RFC 3339.
    #[serde(default)]
    until: Option<String>,
    /// A date attribute of the contact.
    #[serde(default)]
    until_attribute: Option<String>,
    /// Added to `untilAttribute` (`-1d`, `2h`).
    #[serde(default)]
    offset: Option<String>,
    #[serde(default)]
    #[allow(dead_code, reason = "read through next_of")]
    next: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WaitForEventSpec {
    event: String,
    timeout: String,
    #[serde(default)]
    on_event: Option<String>,
    #[serde(default)]
    on_timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WaitForEngagementSpec {
    step: String,
    action: domain::workflows::EngagementAction,
    timeout: String,
    #[serde(default)]
    on_engaged: Option<String>,
    #[serde(default)]
    on_timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BranchSpec {
    arms: Vec<ArmSpec>,
    #[serde(default)]
    default: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ArmSpec {
    condition: String,
    #[serde(default)]
    next: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TemplateStepSpec {
    template: String,
    #[serde(default)]
    #[allow(dead_code, reason = "read through next_of")]
    next: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct UpdateSpec {
    set: Map<String, Value>,
    #[serde(default)]
    #[allow(dead_code, reason = "read through next_of")]
    next: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TopicStepSpec {
    topic: String,
    #[serde(default)]
    #[allow(dead_code, reason = "read through next_of")]
    next: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CallSpec {
    url: String,
    #[serde(default)]
    #[allow(dead_code, reason = "read through next_of")]
    next: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GotoSpec {
    target: String,
    max_passes: u32,
    #[serde(default)]
    #[allow(dead_code, reason = "read through next_of")]
    next: Option<Value>,
}

/// The identity fields a contact has beside its attributes.
const IDENTITY_FIELDS: [&str; 3] = ["email", "phone", "userId"];
/// The fields of every contact document beside its attributes.
const CONTACT_FIELDS: [&str; 7] = ["id", "source", "userId", "email", "phone", "createdAt", "updatedAt"];

impl Resolver<'_> {
    fn step(&self, id: &str, fields: &Map<String, Value>, following: Option<String>) -> anyhow::Result<Step> {
        let kind = fields.get("type").and_then(Value::as_str).context("type is required")?;
        let next = || next_of(fields, &following);
        let kind = match kind {
            "incoming_webhook" => {
                let spec: EntrySpec = fields_of(fields)?;
                let reference_id = spec.reference_id.trim().to_owned();
                let valid = !reference_id.is_empty()
                    && reference_id.len() <= 100
                    && reference_id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
                if !valid {
                    bail!("referenceId must be 1 to 100 letters, digits, '-', '_' or '.'");
                }
                StepKind::IncomingWebhook { reference_id, next: next()? }
            }
            "wait" => {
                let spec: WaitSpec = fields_of(fields)?;
                let wait = match (&spec.duration, &spec.until, &spec.until_attribute) {
                    (Some(duration), None, None) => Wait::For { ms: parse_duration(duration)? },
                    (None, Some(until), None) => Wait::Until {
                        at_ms: chrono::DateTime::parse_from_rfc3339(until)
                            .with_context(|| format!("until {until:?} is not an RFC 3339 time"))?
                            .timestamp_millis(),
                    },
                    (None, None, Some(attribute)) => {
                        if !self.attributes.contains(&attribute.as_str()) {
                            bail!("untilAttribute {attribute:?} is not an attribute of the contact schema");
                        }
                        let offset_ms = match spec.offset.as_deref().map(str::trim) {
                            None => 0,
                            Some(text) => match text.strip_prefix('-') {
                                Some(rest) => -parse_duration(rest)?,
                                None => parse_duration(text.trim_start_matches('+'))?,
                            },
                        };
                        Wait::UntilAttribute { attribute: attribute.clone(), offset_ms }
                    }
                    _ => bail!("a wait has exactly one of duration, until and untilAttribute"),
                };
                StepKind::Wait { wait, next: next()? }
            }
            "wait_for_event" => {
                let spec: WaitForEventSpec = fields_of(fields)?;
                StepKind::WaitForEvent {
                    event_schema_id: self.event_schema(&spec.event)?,
                    timeout_ms: parse_duration(&spec.timeout)?,
                    on_event: optional_step(spec.on_event),
                    on_timeout: optional_step(spec.on_timeout),
                }
            }
            "wait_for_engagement" => {
                let spec: WaitForEngagementSpec = fields_of(fields)?;
                StepKind::WaitForEngagement {
                    step: spec.step,
                    action: spec.action,
                    timeout_ms: parse_duration(&spec.timeout)?,
                    on_engaged: optional_step(spec.on_engaged),
                    on_timeout: optional_step(spec.on_timeout),
                }
            }
            "branch" => {
                let spec: BranchSpec = fields_of(fields)?;
                if spec.arms.is_empty() {
                    bail!("a branch has at least one arm");
                }
                let arms = spec
                    .arms
                    .into_iter()
                    .map(|arm| {
                        let condition =
                            self.condition(&arm.condition).with_context(|| format!("condition {:?}", arm.condition))?;
                        Ok(Arm { condition, description: arm.condition, next: optional_step(arm.next) })
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                StepKind::Branch { arms, default: optional_step(spec.default) }
            }
            "send_email" => {
                let spec: TemplateStepSpec = fields_of(fields)?;
                let template_id = self
                    .names
                    .templates
                    .get(spec.template.as_str())
                    .with_context(|| format!("template {:?} is not a template of the space", spec.template))?;
                StepKind::SendEmail { template_id: template_id.clone(), next: next()? }
            }
            "update_contact" => {
                let spec: UpdateSpec = fields_of(fields)?;
                if spec.set.is_empty() {
                    bail!("set names at least one attribute");
                }
                let mut set = BTreeMap::new();
                for (key, value) in spec.set {
                    if !self.attributes.contains(&key.as_str()) && !IDENTITY_FIELDS.contains(&key.as_str()) {
                        bail!("set names {key:?}, which is not an attribute or identity field of the contact schema");
                    }
                    let source = match value {
                        Value::Object(object) if object.len() == 1 && object.contains_key("input") => {
                            let path = object["input"].as_str().context("{\"input\": \"<path>\"} takes a text path")?;
                            FieldPath::parse(path).map_err(|error| anyhow::anyhow!("input path {path:?}: {error}"))?;
                            Source::Input(path.to_owned())
                        }
                        value => {
                            // A literal is held to the attribute's type and maximum now, as
                            // the run holds it when it reaches the step.
                            if self.definitions.iter().any(|entry| entry.key == key) {
                                domain::attributes::writable_record_value(self.definitions, &key, value.clone())
                                    .map_err(|issue| anyhow::anyhow!("set {key:?}: {}", issue.message))?;
                            }
                            Source::Value(value)
                        }
                    };
                    set.insert(key, source);
                }
                StepKind::UpdateContact { set, next: next()? }
            }
            "subscribe" | "unsubscribe" => {
                let spec: TopicStepSpec = fields_of(fields)?;
                let topic_id = self
                    .names
                    .topics
                    .get(spec.topic.as_str())
                    .with_context(|| format!("topic {:?} is not a topic of the space", spec.topic))?
                    .clone();
                if kind == "subscribe" {
                    StepKind::Subscribe { topic_id, next: next()? }
                } else {
                    StepKind::Unsubscribe { topic_id, next: next()? }
                }
            }
            "call_webhook" => {
                let spec: CallSpec = fields_of(fields)?;
                // Loopback is checked when the call is made, under the deployment's setting.
                if let Some(refusal) = domain::webhooks::target::url_refusal(&spec.url, true) {
                    bail!("url {:?} {}", spec.url, refusal.message());
                }
                StepKind::CallWebhook { url: spec.url, next: next()? }
            }
            "goto" => {
                let spec: GotoSpec = fields_of(fields)?;
                StepKind::Goto { target: spec.target, max_passes: spec.max_passes, next: next()? }
            }
            "exit" => {
                if fields.keys().any(|key| key != "id" && key != "type") {
                    bail!("an exit step has no other fields");
                }
                StepKind::Exit
            }
            other => bail!(
                "type {other:?} is not a step type (incoming_webhook, wait, wait_for_event, wait_for_engagement, branch, \
                 send_email, update_contact, subscribe, unsubscribe, call_webhook, goto, exit)"
            ),
        };
        Ok(Step { id: id.to_owned(), kind })
    }

    fn event_schema(&self, slug: &str) -> anyhow::Result<String> {
        match self.names.schemas.by_slug.get(slug) {
            Some((schema_id, "event", _)) => Ok(schema_id.clone()),
            _ => bail!("event {slug:?} is not an event schema of the space"),
        }
    }

    /// A branch condition in the filter language, with its names resolved: `input.<path>`,
    /// `contact.<field>` (or a bare contact field), `has email consent`, `subscribed to
    /// <topic>`, `segments.<segmentId>` and `steps.<stepId>.<path>`.
    fn condition(&self, text: &str) -> anyhow::Result<Filter> {
        let filter = filter::parse_plain(text).map_err(|error| anyhow::anyhow!("{error}"))?;
        filter::rewrite(filter, &mut |leaf| match leaf {
            Filter::Performed(_) | Filter::Engaged(_) => {
                bail!(
                    "`performed`, `opened` and `clicked` are for segments: define a segment and use \
                     segments.<segmentId> is true"
                )
            }
            Filter::Condition(mut condition) => {
                let path = self.field(condition.field.as_str())?;
                condition.field = FieldPath::parse(&path).map_err(|error| anyhow::anyhow!("{error}"))?;
                Ok(Filter::Condition(condition))
            }
            other => Ok(other),
        })
    }

    fn field(&self, path: &str) -> anyhow::Result<String> {
        let (head, rest) = path.split_once('.').unwrap_or((path, ""));
        Ok(match head {
            "input" | "steps" if !rest.is_empty() => path.to_owned(),
            "contact" if self.is_contact_field(rest.split('.').next().unwrap_or_default()) => path.to_owned(),
            "subscriptions" => {
                let topic_id = self
                    .names
                    .topics
                    .get(rest)
                    .cloned()
                    .or_else(|| self.names.topics.values().find(|id| id.as_str() == rest).cloned())
                    .with_context(|| format!("topic {rest:?} is not a topic of the space"))?;
                format!("subscriptions.{topic_id}")
            }
            "segments" => {
                if !self.names.segments.contains(rest) {
                    bail!("segment {rest:?} is not a segment of the space");
                }
                path.to_owned()
            }
            _ if path == CONSENT_EMAIL => path.to_owned(),
            _ if self.is_contact_field(head) => format!("contact.{path}"),
            _ => bail!(
                "{path:?} is not something a condition reads: use input.<path>, contact.<field>, has email consent, \
                 subscribed to <topic>, segments.<segmentId> or steps.<stepId>.<path>"
            ),
        })
    }

    fn is_contact_field(&self, field: &str) -> bool {
        self.attributes.contains(&field) || CONTACT_FIELDS.contains(&field)
    }

    /// `steps.<id>` conditions name steps of the workflow.
    fn check_step_references(&self, filter: &Filter, step_ids: &BTreeSet<&str>) -> anyhow::Result<()> {
        match filter {
            Filter::All(parts) | Filter::Any(parts) => {
                parts.iter().try_for_each(|part| self.check_step_references(part, step_ids))
            }
            Filter::Not(inner) => self.check_step_references(inner, step_ids),
            Filter::Condition(condition) => {
                let mut segments = condition.field.segments();
                if segments.next() == Some("steps") {
                    let step = segments.next().unwrap_or_default();
                    if !step_ids.contains(step) {
                        bail!("it reads steps.{step}, which is not a step of the workflow");
                    }
                }
                Ok(())
            }
            Filter::Performed(_) | Filter::Engaged(_) => Ok(()),
        }
    }
}
