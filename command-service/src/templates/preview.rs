//! `POST /templates/{templateId}/preview`: what a send of the template would render, for a
//! stored contact (`contactId`) or for data given in the body, in the contact's locale or
//! the one the body names. Nothing is written, sent, counted or tracked: the decision
//! answers without an append.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use domain::email::resources::TEMPLATE;
use mail::send::{self, Authored, Site, Wanted};
use platform::error::{ApiError, Issue};
use serde_json::{Map, Value, json};

use super::decide::{Refusal, render_context};
use crate::State;
use crate::decision::{Decide, Given, Outcome, Reply};
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Protection, Shell};

/// A preview's body: whose data, and in which locale.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    /// The stored contact the recipient key renders.
    pub contact_id: Option<String>,
    /// Record fields by context key, as a send's `data` gives them (nothing is written).
    pub data: BTreeMap<String, Map<String, Value>>,
    /// A canonical tag that replaces the contact's locale.
    pub locale: Option<String>,
}

fn invalid_field(field: &str, message: &str) -> Refusal {
    Refusal::InvalidField { field: field.to_owned(), message: message.to_owned() }
}

fn invalid_data(field: &str, message: &str) -> Refusal {
    Refusal::InvalidData { message: message.to_owned(), issues: vec![Issue::for_key(field, message)] }
}

/// The body `{contactId?, data?, locale?}`.
pub fn parse(body: &Map<String, Value>) -> Result<Request, Refusal> {
    let mut request = Request::default();
    for (field, value) in body {
        match (field.as_str(), value) {
            ("contactId", Value::String(id)) => request.contact_id = Some(id.clone()),
            ("contactId", _) => return Err(invalid_field("contactId", "contactId must be a contact's id")),
            ("data", Value::Object(data)) => {
                for (key, fields) in data {
                    let Value::Object(fields) = fields else {
                        let message = "each context value is an object of the record's fields";
                        return Err(invalid_data(&format!("data.{key}"), message));
                    };
                    request.data.insert(key.clone(), fields.clone());
                }
            }
            ("data", _) => {
                let message = "data must be an object of context records, one per key the template expects";
                return Err(invalid_data("data", message));
            }
            ("locale", Value::String(tag)) => match domain::email::locale::normalize(tag) {
                Some(tag) => request.locale = Some(tag),
                None => {
                    let message = format!("{tag:?} is not a language tag (BCP 47, like \"de\" or \"pt-BR\")");
                    return Err(invalid_field("locale", &message));
                }
            },
            ("locale", _) => return Err(invalid_field("locale", "locale must be a language tag")),
            (other, _) => return Err(Refusal::UnknownField(other.to_owned())),
        }
    }
    Ok(request)
}

pub struct PreviewTemplate<'a> {
    pub space_id: String,
    pub template_id: String,
    pub request: Request,
    pub site: &'a Site,
}

/// What a preview renders: the template, the stored contact's document (when one is named),
/// and each data key's attribute keys.
pub struct Loaded {
    pub authored: Arc<Authored>,
    pub contact: Option<Value>,
    pub attributes: BTreeMap<String, Vec<String>>,
}

impl Decide for PreviewTemplate<'_> {
    type Loaded = Loaded;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Loaded, _: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let rendered = render(&loaded, &self.request, self.site)?;
        let authored = &loaded.authored;
        let parts: Vec<Value> =
            authored.parts.revisions().into_iter().map(|part| domain::email::story::part_document(&part)).collect();
        Ok(Outcome::Answer(Reply::ok(json!({
            "templateId": authored.template_id,
            "templateRevision": authored.revision,
            "subject": rendered.subject,
            "html": rendered.html,
            "text": rendered.text,
            "locale": rendered.locale.map(|locale| json!({"tag": locale.tag, "source": locale.source})),
            "parts": parts,
        }))))
    }
}

/// What the template renders for the request's data in its locale, as a preview shows it
/// (and a test send sends it): the keys checked against the template's, the documents made,
/// the variant chosen.
pub fn render(loaded: &Loaded, request: &Request, site: &Site) -> Result<mail::render::Rendered, Refusal> {
    let Loaded { authored, contact, attributes } = loaded;
    let template = &authored.template;
    let mut issues = Vec::new();
    for key in request.data.keys().filter(|key| !template.data.contains_key(*key)) {
        issues.push(Issue::for_key(format!("data.{key}"), "the template expects no such key"));
    }
    if contact.is_some() && request.data.contains_key(&template.recipient) {
        let message = "give the recipient's data or contactId, not both";
        issues.push(Issue::for_key(format!("data.{}", template.recipient), message));
    }
    let mut documents = BTreeMap::new();
    for (key, expected) in &template.data {
        let keys = attributes.get(key).cloned().unwrap_or_default();
        let document = match (contact, request.data.get(key)) {
            (Some(contact), _) if *key == template.recipient => contact.clone(),
            (_, Some(fields)) => domain::records::unstored_document(&expected.schema_type, fields),
            _ => {
                let message = if *key == template.recipient {
                    "give contactId or the recipient's fields under this key"
                } else {
                    "the template expects a record under this key"
                };
                issues.push(Issue::for_key(format!("data.{key}"), message));
                continue;
            }
        };
        documents.insert(key.clone(), (document, keys));
    }
    if !issues.is_empty() {
        let message = "the context does not match what the template expects".to_owned();
        return Err(Refusal::InvalidData { message, issues });
    }
    let context = render_context(&documents);
    let wanted = match &request.locale {
        Some(tag) => Wanted::Tag(tag.clone()),
        None => send::locale_of(template, &context),
    };
    send::preview(authored, context, site, wanted).map_err(Refusal::RenderFailed)
}

impl Command for PreviewTemplate<'_> {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Loaded, ApiError> {
        load(ctx, &self.space_id, &self.template_id, &self.request).await
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }
}

/// The template, the named contact's current document and each key's attribute keys.
pub async fn load(ctx: &Ctx<'_>, space_id: &str, template_id: &str, request: &Request) -> Result<Loaded, ApiError> {
    let authored = super::http::load_authored(ctx, space_id, template_id).await?;
    let mut attributes = BTreeMap::new();
    for (key, expected) in &authored.template.data {
        let context =
            crate::write_contexts::current(ctx, crate::write_contexts::Kind::Record, space_id, &expected.schema_id)
                .await?;
        attributes.insert(key.clone(), context.attributes.iter().map(|attribute| attribute.key.clone()).collect());
    }
    let contact = match &request.contact_id {
        None => None,
        Some(contact_id) => {
            let recipient_schema = authored.template.data.get(&authored.template.recipient).map(|key| &key.schema_id);
            let loaded = reads::records::load_records(&ctx.db().await?, std::slice::from_ref(contact_id))
                .await
                .map_err(ApiError::from)?;
            let state = loaded.into_iter().find_map(|(_, _, loaded)| match loaded {
                domain::records::Loaded::Live { state, .. }
                    if state.space_id == space_id && Some(&state.schema_id) == recipient_schema =>
                {
                    Some(state)
                }
                _ => None,
            });
            let Some(state) = state else { return Err(Refusal::ContactNotFound(contact_id.clone()).into()) };
            Some(state.document())
        }
    };
    Ok(Loaded { authored, contact, attributes })
}

#[tracing::instrument(skip_all, fields(template = %path.as_str()))]
pub async fn preview(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Read).await?;
    let body = api::http::read_json_object(&req, payload).await?;
    let request = parse(&body)?;
    let template_id = pipeline::authored_id(&state, (TEMPLATE, caller.space_id()), path.into_inner()).await?;
    let command = PreviewTemplate { space_id: caller.space_id().to_owned(), template_id, request, site: &state.site };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use platform::error::Code;
    use platform::refusal::Refusal as _;

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn the_body_names_a_contact_or_data_and_a_locale_that_is_a_language_tag() {
        let request = parse(&body(json!({"contactId": "con_1", "locale": "pt_br"}))).expect("valid");
        assert_eq!(request.contact_id.as_deref(), Some("con_1"));
        assert_eq!(request.locale.as_deref(), Some("pt-BR"));
        let code = |value: Value| parse(&body(value)).err().map(|refusal| refusal.code());
        assert_eq!(code(json!({"locale": "english"})), Some(Code::InvalidField));
        assert_eq!(code(json!({"locale": 7})), Some(Code::InvalidField));
        assert_eq!(code(json!({"contactId": 7})), Some(Code::InvalidField));
        assert_eq!(code(json!({"data": {"contact": 1}})), Some(Code::InvalidTemplateData));
        assert_eq!(code(json!({"subject": "mine"})), Some(Code::UnknownField));
    }
}
