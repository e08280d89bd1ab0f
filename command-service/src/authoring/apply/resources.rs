//! What a space's schemas, contact tracks and suppressions append, each against its stream's
//! latest event; the names its workflows may use; a resource definition's stream and revision.

use domain::email::resources::{TEMPLATE, TOPIC};
use platform::events::LogEvent;
use platform::ids::derived_id;
use platform::proto;
use serde_json::Value;

use super::super::format::{ResourceSpec, SpaceSpec, SuppressionSpec};
use super::super::{email, workflows};
use super::Plan;

pub(super) fn plan_schemas(plan: &mut Plan<'_>, space: &SpaceSpec, space_id: &str) {
    for schema in &space.schemas {
        let schema_id = derived_id("sch", &["schema", &space.slug, &schema.slug]);
        let stream_id = format!("authoring/schema/{schema_id}");
        let previous = match plan.latest(&stream_id) {
            Some(LogEvent::SchemaDefined(previous)) => Some(previous.clone()),
            _ => None,
        };
        let attributes = schema
            .attributes
            .iter()
            .enumerate()
            .map(|(index, attribute)| {
                let attribute_id = derived_id("att", &["attribute", &space.slug, &schema.slug, &attribute.key]);
                let mut definition = attribute.definition.clone();
                let expression = definition.remove("expression").and_then(|e| e.as_str().map(str::to_owned));
                let created_at_ms = previous
                    .as_ref()
                    .and_then(|p| p.attributes.iter().find(|a| a.attribute_id == attribute_id))
                    .map_or(plan.now_ms, |a| a.created_at_ms);
                proto::AttributeDefinition {
                    attribute_id,
                    key: attribute.key.clone(),
                    name: attribute.name.clone().unwrap_or_else(|| attribute.key.clone()),
                    sequence: index as i64 + 1,
                    definition_json: Value::Object(definition).to_string(),
                    generated_expression: expression.unwrap_or_default(),
                    created_at_ms,
                    updated_at_ms: created_at_ms,
                    description: attribute.description.clone().unwrap_or_default(),
                }
            })
            .collect();
        let mut desired = proto::SchemaDefined {
            schema_id,
            space_id: space_id.to_owned(),
            slug: schema.slug.clone(),
            name: schema.name.clone(),
            schema_type: schema.schema_type.clone(),
            revision: 1,
            attributes,
            created_at_ms: plan.now_ms,
            updated_at_ms: plan.now_ms,
            description: schema.description.clone().unwrap_or_default(),
        };
        if let Some(previous) = &previous {
            // Compare with revision and times taken from the stored definition: unchanged
            // content means nothing to append.
            let mut same = desired.clone();
            same.revision = previous.revision;
            same.created_at_ms = previous.created_at_ms;
            same.updated_at_ms = previous.updated_at_ms;
            for attribute in &mut same.attributes {
                if let Some(old) = previous.attributes.iter().find(|a| a.attribute_id == attribute.attribute_id) {
                    attribute.updated_at_ms = old.updated_at_ms;
                }
            }
            if same == *previous {
                continue;
            }
            desired.revision = previous.revision + 1;
            desired.created_at_ms = previous.created_at_ms;
            for attribute in &mut desired.attributes {
                if let Some(old) = previous.attributes.iter().find(|a| a.attribute_id == attribute.attribute_id) {
                    let unchanged = old.definition_json == attribute.definition_json
                        && old.name == attribute.name
                        && old.description == attribute.description
                        && old.generated_expression == attribute.generated_expression;
                    attribute.updated_at_ms = if unchanged { old.updated_at_ms } else { plan.now_ms };
                }
            }
        }
        plan.ensure(stream_id, LogEvent::SchemaDefined(desired));
    }
}

/// An authored suppression is added once; applying again leaves it (and its creation time)
/// alone. It takes its identity key without failing when the API added the same one. Authored
/// suppressions are global or provider ones, which the API never removes, so they live in
/// authoring streams.
pub(super) fn plan_suppression(plan: &mut Plan<'_>, space_id: &str, spec: &SuppressionSpec) {
    let identifier = spec.identifier.trim().to_lowercase();
    let scope = domain::suppressions::scope(space_id).to_owned();
    let suppression_id = derived_id("sup", &["suppression", &scope, &identifier, &spec.reason]);
    let stream_id = crate::suppressions::store::authored_stream_id(&suppression_id);
    if matches!(plan.latest(&stream_id), Some(LogEvent::SuppressionAdded(_))) {
        return;
    }
    let source = if matches!(spec.reason.as_str(), "bounce" | "complaint") { "provider" } else { "authoring" };
    let new =
        crate::suppressions::decide::NewSuppression { identifier: identifier.clone(), reason: spec.reason.clone() };
    let added = crate::suppressions::decide::decide_add(space_id, &new, &suppression_id, plan.now_ms, source);
    plan.ensure(stream_id, LogEvent::SuppressionAdded(added));
    plan.guards.push(crate::suppressions::store::authored_key_guard(&scope, &new, &suppression_id));
}

/// What the workflows of a space may name: its schemas, templates and topics (by slug), and
/// its live segments (made through the API, so read from the log).
pub(super) fn workflow_names<'a>(plan: &Plan<'_>, space: &'a SpaceSpec, space_id: &str) -> workflows::Names<'a> {
    let ids = |kind: &str, prefix: &str, list: &'a [ResourceSpec]| {
        list.iter()
            .map(|resource| (resource.slug.as_str(), email::resource_id(kind, prefix, &space.slug, resource)))
            .collect()
    };
    let segments = plan
        .current
        .iter()
        .filter_map(|(stream_id, (_, event))| match event {
            LogEvent::SegmentCreated(created) if created.space_id == space_id && stream_id.starts_with("segment-") => {
                Some(created.segment_id.clone())
            }
            _ => None,
        })
        .collect();
    workflows::Names {
        schemas: email::Schemas::of(space),
        templates: ids(TEMPLATE, "tpl", &space.templates),
        topics: ids(TOPIC, "top", &space.topics),
        segments,
    }
}

pub(super) fn plan_resources(plan: &mut Plan<'_>, space: &SpaceSpec, space_id: &str) {
    // The email resources (broadcasts too) and workflows are typed and resolved by `email`
    // and `workflows`.
    let kinds: [(&str, &str, &Vec<ResourceSpec>); 1] = [("contact_track", "trk", &space.contact_tracks)];
    for (kind, prefix, resources) in kinds {
        for resource in resources {
            let resource_id = email::resource_id(kind, prefix, &space.slug, resource);
            let mut definition = resource.fields.clone();
            definition.insert("slug".into(), Value::String(resource.slug.clone()));
            ensure_resource(
                plan,
                proto::ResourceDefined {
                    kind: kind.to_owned(),
                    resource_id,
                    space_id: space_id.to_owned(),
                    definition_json: Value::Object(definition).to_string(),
                    revision: 0,
                },
            );
        }
    }
}

/// The stream an authored resource's definitions are appended to.
pub(crate) fn resource_stream(kind: &str, resource_id: &str) -> String {
    format!("authoring/{kind}/{resource_id}")
}

/// Resources carry a revision: unchanged content keeps the stored one, changes bump it.
pub(super) fn ensure_resource(plan: &mut Plan<'_>, mut resource: proto::ResourceDefined) {
    let stream_id = resource_stream(&resource.kind, &resource.resource_id);
    match plan.latest(&stream_id) {
        Some(LogEvent::ResourceDefined(previous)) if previous.definition_json == resource.definition_json => return,
        Some(LogEvent::ResourceDefined(previous)) => resource.revision = previous.revision + 1,
        _ => resource.revision = 1,
    }
    plan.ensure(stream_id, LogEvent::ResourceDefined(resource));
}
