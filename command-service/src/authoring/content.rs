//! A space's content beyond one template body: the contact attribute that holds a locale,
//! partials and layouts, templates' variants by locale, and the checks each variant passes
//! when the file is applied. A variant is rendered with sample data of its declared schemas,
//! inside its layout and with the partials of its locale, so what `apply` accepts renders at
//! a send unless the data itself makes it fail.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, bail};
use domain::email::locale;
use domain::email::resources::{LAYOUT, PARTIAL, PageTextDef, PartDef, PartVariant, TemplateDef, Variant};
use mail::render::{self, Partials, Sources};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::format::{ResourceSpec, Schemas, SpaceSpec, resource_id};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PartSpec {
    html: String,
    /// What a text body or a subject renders; absent: the HTML.
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    locales: BTreeMap<String, PartVariantSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PartVariantSpec {
    html: String,
    #[serde(default)]
    text: Option<String>,
}

/// A template's variant for one locale.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct VariantSpec {
    subject: String,
    html: String,
    text: String,
}

/// The space's locale setting, partials and layouts, checked on their own.
pub(super) struct Content {
    /// The locale attribute and the default tag (canonical).
    pub locale: Option<(String, String)>,
    /// Slug → (id, definition).
    partials: BTreeMap<String, (String, PartDef)>,
    layouts: BTreeMap<String, (String, PartDef)>,
}

fn tag(given: &str, owner: &str) -> anyhow::Result<String> {
    locale::normalize(given).with_context(|| {
        format!("{owner}: {given:?} is not a language tag (BCP 47, like \"fr\", \"pt-BR\" or \"zh-Hant\")")
    })
}

fn part(kind: &str, resource: &ResourceSpec) -> anyhow::Result<PartDef> {
    let owner = format!("{kind} {:?}", resource.slug);
    let input: PartSpec = serde_json::from_value(Value::Object(resource.fields.clone()))
        .with_context(|| format!("{owner} is not valid"))?;
    let mut locales = BTreeMap::new();
    for (given, variant) in input.locales {
        let text = variant.text.unwrap_or_else(|| variant.html.clone());
        if locales.insert(tag(&given, &owner)?, PartVariant { html: variant.html, text }).is_some() {
            bail!("{owner}: locale {given:?} is given twice");
        }
    }
    let text = input.text.unwrap_or_else(|| input.html.clone());
    Ok(PartDef { slug: resource.slug.clone(), html: input.html, text, locales })
}

/// Every (locale, body, source) of a part, for checks: the default first.
fn sources_of(def: &PartDef) -> Vec<(String, &'static str, &str)> {
    let mut out =
        vec![("default".to_owned(), "html", def.html.as_str()), ("default".to_owned(), "text", def.text.as_str())];
    for (tag, variant) in &def.locales {
        out.push((tag.clone(), "html", variant.html.as_str()));
        out.push((tag.clone(), "text", variant.text.as_str()));
    }
    out
}

/// The partials a part renders, each source parsed.
fn named_in(owner: &str, def: &PartDef) -> anyhow::Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for (tag, body, source) in sources_of(def) {
        let at = |error: String| {
            let line = render::line_of(source, &error).map(|line| format!(" line {line}")).unwrap_or_default();
            anyhow::anyhow!("{owner}, locale {tag}, {body}{line}: {error}")
        };
        render::check(source).map_err(at)?;
        names.extend(render::partials_named(source).map_err(at)?);
    }
    Ok(names)
}

impl Content {
    /// The space's content as the file gives it, each partial and layout parsed; a partial
    /// or a layout that names an unknown partial, and partials that render each other in a
    /// cycle, are refused.
    pub(super) fn of(space: &SpaceSpec, schemas: &Schemas<'_>) -> anyhow::Result<Self> {
        let locale = match &space.locale {
            None => None,
            Some(spec) => {
                let typed = schemas.attributes.iter().find_map(|(slug, attributes)| {
                    let (_, schema_type, _) = schemas.by_slug.get(slug)?;
                    let attribute = attributes.iter().find(|attribute| attribute.key == spec.attribute)?;
                    (*schema_type == "contact").then_some(attribute)
                });
                let Some(attribute) = typed else {
                    bail!("locale.attribute {:?} is not an attribute of a contact schema of the space", spec.attribute);
                };
                let kind = attribute.definition.get("type").and_then(Value::as_str).unwrap_or("json");
                if !matches!(kind, "string" | "select") {
                    bail!(
                        "locale.attribute {:?} is of type {kind}; a locale is held in a string or select",
                        spec.attribute
                    );
                }
                Some((spec.attribute.clone(), tag(&spec.default, "locale.default")?))
            }
        };
        let mut partials = BTreeMap::new();
        let mut calls: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for resource in &space.partials {
            let def = part(PARTIAL, resource)?;
            let owner = format!("partial {:?}", resource.slug);
            calls.insert(resource.slug.clone(), named_in(&owner, &def)?);
            let id = resource_id(PARTIAL, "prt", &space.slug, resource);
            partials.insert(resource.slug.clone(), (id, def));
        }
        for (slug, named) in &calls {
            if let Some(unknown) = named.iter().find(|name| !partials.contains_key(*name)) {
                bail!("partial {slug:?} renders partial {unknown:?}, which the space does not define");
            }
        }
        if let Some(cycle) = cycle(&calls) {
            bail!("partials render each other in a cycle: {}", cycle.join(" → "));
        }
        let mut layouts = BTreeMap::new();
        for resource in &space.layouts {
            let def = part(LAYOUT, resource)?;
            let owner = format!("layout {:?}", resource.slug);
            for name in named_in(&owner, &def)? {
                if !partials.contains_key(&name) {
                    bail!("{owner} renders partial {name:?}, which the space does not define");
                }
            }
            let id = resource_id(LAYOUT, "lyt", &space.slug, resource);
            layouts.insert(resource.slug.clone(), (id, def));
        }
        Ok(Self { locale, partials, layouts })
    }

    /// The space's locale setting and page text, checked (each locale's tag, keys and
    /// sentences); `None` when the space has neither and never had.
    pub(super) fn page_text(&self, space: &SpaceSpec, had_one: bool) -> anyhow::Result<Option<PageTextDef>> {
        if self.locale.is_none() && space.page_text.is_empty() && !had_one {
            return Ok(None);
        }
        let mut locales = BTreeMap::new();
        for (given, text) in &space.page_text {
            let owner = format!("pageText.{given}");
            let canonical = tag(given, &owner)?;
            if let Some(why) = domain::email::page_text::check(text) {
                bail!("{owner}: {why}");
            }
            if locales.insert(canonical, text.clone()).is_some() {
                bail!("{owner}: the locale is given twice");
            }
        }
        let (locale_attribute, default_locale) = self.locale.clone().unzip();
        Ok(Some(PageTextDef { locale_attribute, default_locale, locales }))
    }

    /// The definitions (kind, id, JSON) of the partials and layouts.
    pub(super) fn definitions(&self) -> anyhow::Result<Vec<(&'static str, String, Value)>> {
        let mut out = Vec::new();
        for (kind, parts) in [(PARTIAL, &self.partials), (LAYOUT, &self.layouts)] {
            for (id, def) in parts.values() {
                out.push((kind, id.clone(), serde_json::to_value(def)?));
            }
        }
        Ok(out)
    }

    /// The partials `names` render, with theirs, and so on: slug → id.
    fn closure(&self, names: impl IntoIterator<Item = String>) -> anyhow::Result<BTreeMap<String, String>> {
        let mut found = BTreeMap::new();
        let mut queue: Vec<String> = names.into_iter().collect();
        while let Some(name) = queue.pop() {
            if found.contains_key(&name) {
                continue;
            }
            let (id, def) = self.partials.get(&name).with_context(|| format!("partial {name:?} is not defined"))?;
            found.insert(name.clone(), id.clone());
            for (_, _, source) in sources_of(def) {
                queue.extend(render::partials_named(source).map_err(anyhow::Error::msg)?);
            }
        }
        Ok(found)
    }

    /// Gives `template` its locale, its variants, its layout and the partials it renders,
    /// then renders each variant with sample data (`sample`: the context a send of it would
    /// give, its values made up from the declared schemas): a variant that names an unknown
    /// partial, does not parse or does not render is refused, naming the template, the
    /// locale, the body and the line. A layout must show the body (`{{ content }}`) in both
    /// bodies; a marketing template's must also show the unsubscribe link and the sender's
    /// postal address, which the footer would otherwise add.
    pub(super) fn complete(
        &self,
        owner: &str,
        template: &mut TemplateDef,
        (locale_given, locales, layout): (Option<&str>, BTreeMap<String, VariantSpec>, Option<&str>),
        sample: &Value,
    ) -> anyhow::Result<()> {
        template.locale_attribute = self.locale.as_ref().map(|(attribute, _)| attribute.clone());
        template.locale = match locale_given {
            Some(given) => Some(tag(given, owner)?),
            None => self.locale.as_ref().map(|(_, default)| default.clone()),
        };
        if !locales.is_empty() && template.locale.is_none() {
            bail!("{owner} has locales but no default locale; give it `locale` or the space `locale`");
        }
        for (given, variant) in locales {
            let canonical = tag(&given, owner)?;
            if template.locale.as_ref() == Some(&canonical) {
                bail!(
                    "{owner}: locale {given:?} is its default locale; its own subject, html and text are that variant"
                );
            }
            let variant = Variant { subject: variant.subject, html: variant.html, text: variant.text };
            if template.locales.insert(canonical, variant).is_some() {
                bail!("{owner}: locale {given:?} is given twice");
            }
        }
        let layout = match layout {
            None => None,
            Some(slug) => Some(
                self.layouts
                    .get(slug)
                    .with_context(|| format!("{owner} names layout {slug:?}, which the space does not define"))?,
            ),
        };
        template.layout_id = layout.map(|(id, _)| id.clone());
        let mut variants =
            vec![(template.locale.clone(), template.subject.clone(), template.html.clone(), template.text.clone())];
        variants.extend(
            template
                .locales
                .iter()
                .map(|(tag, v)| (Some(tag.clone()), v.subject.clone(), v.html.clone(), v.text.clone())),
        );
        let mut named = BTreeSet::new();
        for (tag, subject, html, text) in &variants {
            let shown = tag.as_deref().unwrap_or("default");
            for (body, source) in [("subject", subject), ("html", html), ("text", text)] {
                let at = |error: String| {
                    let line = render::line_of(source, &error).map(|line| format!(" line {line}")).unwrap_or_default();
                    anyhow::anyhow!("{owner}, locale {shown}, {body}{line}: {error}")
                };
                render::check(source).map_err(at)?;
                for name in render::partials_named(source).map_err(at)? {
                    if !self.partials.contains_key(&name) {
                        let quoted = [format!("'{name}'"), format!("\"{name}\"")];
                        let line = source.lines().position(|line| quoted.iter().any(|quoted| line.contains(quoted)));
                        let line = line.map(|index| format!(" line {}", index + 1)).unwrap_or_default();
                        bail!(
                            "{owner}, locale {shown}, {body}{line}: it renders partial {name:?}, which the space does not define"
                        );
                    }
                    named.insert(name);
                }
            }
        }
        if let Some((_, def)) = layout {
            for (_, _, source) in sources_of(def) {
                named.extend(render::partials_named(source).map_err(anyhow::Error::msg)?);
            }
        }
        template.partials = self.closure(named)?;
        for (tag, subject, html, text) in &variants {
            self.check_variant(
                owner,
                template,
                (tag.as_deref(), subject, html, text),
                layout.map(|(_, def)| def),
                sample,
            )?;
        }
        Ok(())
    }

    fn check_variant(
        &self,
        owner: &str,
        template: &TemplateDef,
        (tag, subject, html, text): (Option<&str>, &str, &str, &str),
        layout: Option<&PartDef>,
        sample: &Value,
    ) -> anyhow::Result<()> {
        let shown = tag.unwrap_or("default");
        let (html_partials, text_partials) = self.partials_for(template, tag);
        let layout = layout.map(|def| def.variant(tag));
        let sources =
            Sources { subject, html, text, layout, html_partials: &html_partials, text_partials: &text_partials };
        if let Err(error) = render::render_sample(&sources, sample)
            && !render::is_missing_under(&error, "input")
        {
            let source = [("subject", subject), ("html", html), ("text", text)]
                .into_iter()
                .chain(layout.map(|(html, _)| ("the layout's html", html)))
                .chain(layout.map(|(_, text)| ("the layout's text", text)))
                .find(|(body, _)| error.starts_with(&format!("{body}:")))
                .map(|(_, source)| source);
            let line = source
                .and_then(|source| render::line_of(source, &error))
                .map(|line| format!(" (line {line})"))
                .unwrap_or_default();
            bail!("{owner}, locale {shown}: does not render with sample data of its schemas{line}: {error}");
        }
        let Some((layout_html, layout_text)) = layout else { return Ok(()) };
        // The layout alone, with markers for the body and the footer's values.
        let mut marked = sample.clone();
        if let Some(values) = marked.as_object_mut() {
            values.insert(render::CONTENT_VARIABLE.to_owned(), json!(CONTENT_MARK));
        }
        let frame = Sources::plain("", layout_html, layout_text);
        let frame = Sources { html_partials: &html_partials, text_partials: &text_partials, ..frame };
        let framed = match render::render_sample(&frame, &marked) {
            Ok(framed) => framed,
            Err(error) if render::is_missing_under(&error, "input") => return Ok(()),
            Err(error) => bail!("{owner}, locale {shown}: its layout does not render with sample data: {error}"),
        };
        for (body, rendered) in [("html", &framed.html), ("text", &framed.text)] {
            if !rendered.contains(CONTENT_MARK) {
                bail!(
                    "{owner}, locale {shown}: the {body} of its layout does not show the template's body ({{{{ content }}}})"
                );
            }
            if template.kind == "marketing" {
                for (variable, mark) in
                    [(mail::footer::UNSUBSCRIBE_VARIABLE, UNSUBSCRIBE_MARK), (mail::send::POSTAL_VARIABLE, POSTAL_MARK)]
                {
                    if !rendered.contains(mark) {
                        bail!(
                            "{owner}, locale {shown}: the {body} of its layout leaves out the marketing footer's \
                             {{{{ {variable} }}}}; a layout may restyle the footer (the sender's postal address and \
                             the unsubscribe link), not remove it"
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// The partials of `template` in the variant for `tag`, as sends render them.
    fn partials_for(&self, template: &TemplateDef, tag: Option<&str>) -> (Partials, Partials) {
        let sources: Vec<(&str, &str, &str)> = template
            .partials
            .keys()
            .filter_map(|slug| {
                let (_, def) = self.partials.get(slug)?;
                let (html, text) = def.variant(tag);
                Some((slug.as_str(), html, text))
            })
            .collect();
        // Keyed by the sources themselves: nothing here has a revision yet.
        Partials::pair(&format!("apply:{sources:?}"), sources)
    }
}

const CONTENT_MARK: &str = "\u{2063}content\u{2063}";
const UNSUBSCRIBE_MARK: &str = "https://unsubscribe.invalid/sample";
const POSTAL_MARK: &str = "\u{2063}postal\u{2063}";

/// A cycle among partials that render each other, as the slugs along it.
fn cycle(calls: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // 0 unvisited, 1 on the current path, 2 done.
    fn visit(
        node: &str,
        calls: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(node).copied().unwrap_or(0) {
            2 => return None,
            1 => {
                let from = path.iter().position(|step| step == node).unwrap_or(0);
                let mut cycle = path[from..].to_vec();
                cycle.push(node.to_owned());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(node.to_owned(), 1);
        path.push(node.to_owned());
        for next in calls.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, calls, state, path) {
                return Some(cycle);
            }
        }
        path.pop();
        state.insert(node.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    calls.keys().find_map(|node| visit(node, calls, &mut state, &mut Vec::new()))
}

/// A value of an attribute's type, for sample renders.
fn sample_value(definition: &Value) -> Value {
    let kind = definition.get("type").and_then(Value::as_str).unwrap_or("json");
    let kind =
        if kind == "evaluated" { definition.get("returnType").and_then(Value::as_str).unwrap_or("json") } else { kind };
    let first_option = || {
        definition
            .get("options")
            .and_then(Value::as_array)
            .and_then(|options| options.first())
            .map(|option| option.get("value").cloned().unwrap_or_else(|| option.clone()))
    };
    match kind {
        "number" => json!(42.5),
        "integer" => json!(42),
        "boolean" => json!(true),
        "date" => json!("2026-01-15"),
        "datetime" => json!("2026-01-15T09:30:00.000Z"),
        "email" => json!("sample@example.com"),
        "select" => first_option().unwrap_or_else(|| json!("sample")),
        "multiselect" => Value::Array(first_option().into_iter().collect()),
        "json" => Value::Null,
        _ => json!("Sample"),
    }
}

/// The context a send of a template with `data` (key → schema slug) would give, its values
/// made up from the schemas: every attribute, the record's own fields, and what the platform
/// adds (`input`; a form confirmation's `confirmUrl` and `form`; marketing mail's footer
/// values, as markers).
pub(super) fn sample_context(
    schemas: &Schemas<'_>,
    data: &BTreeMap<String, (String, String)>,
    marketing: bool,
) -> Value {
    let mut context = Map::new();
    for (key, (slug, schema_type)) in data {
        let values: Map<String, Value> = schemas
            .attributes
            .get(slug.as_str())
            .into_iter()
            .flatten()
            .map(|attribute| (attribute.key.clone(), sample_value(&attribute.definition)))
            .collect();
        // Shaped by the record's own document, as a send renders it.
        let personal = platform::proto::RecordPersonal {
            user_id: Some("user-1".to_owned()),
            email: Some("sample@example.com".to_owned()),
            phone: Some("+15555550100".to_owned()),
            external_id: Some("sample-1".to_owned()),
            values_json: Value::Object(values).to_string(),
        };
        let sample = domain::records::RecordState::unstored(schema_type, personal);
        context.insert(key.clone(), sample.document());
    }
    context.insert("input".into(), json!({}));
    context.insert("confirmUrl".into(), json!("https://confirm.invalid/sample"));
    context.insert("form".into(), json!({"id": "frm_sample", "name": "Sample form"}));
    if marketing {
        context.insert(mail::footer::UNSUBSCRIBE_VARIABLE.into(), json!(UNSUBSCRIBE_MARK));
        context.insert(mail::send::POSTAL_VARIABLE.into(), json!(POSTAL_MARK));
        context.insert(mail::send::SUBSCRIBED_TO_VARIABLE.into(), json!("Sample topic"));
    }
    Value::Object(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(edges: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        edges
            .iter()
            .map(|(from, to)| ((*from).to_owned(), to.iter().map(|name| (*name).to_owned()).collect()))
            .collect()
    }

    #[test]
    fn a_cycle_is_found_along_its_path_and_a_diamond_is_not_one() {
        assert_eq!(
            cycle(&calls(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"])])),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
        assert_eq!(cycle(&calls(&[("a", &["a"])])), Some(vec!["a".into(), "a".into()]));
        assert_eq!(cycle(&calls(&[("a", &["b", "c"]), ("b", &["d"]), ("c", &["d"]), ("d", &[])])), None);
    }
}
