//! Reads of records from the records read model (`records`) and the catalog (`catalog`).

use platform::readmodel::check_with;

/// The schema id of `reference` (id or slug) in space `space`, as a SQL subquery over catalog
/// `catalog` (`space` and `reference` are placeholders).
fn schema_id_subquery(catalog: &str, space: &str, reference: &str) -> String {
    format!(
        "(SELECT schema_id FROM {catalog}.schemas WHERE space_id = {space} AND (schema_id = {reference} OR slug = {reference})
          ORDER BY (schema_id = {reference}) DESC LIMIT 1)"
    )
}

/// A page of the records of schema `$4` (id or slug) in space `$3`, oldest first, `$5` rows
/// from offset `$6`, with the consistency check: one row per record, or one row with a null
/// document when the page is empty. After the check's columns: the schema's type (null when
/// it does not exist), the total, the document, and the record's creation time and id (where
/// the next page starts).
pub(crate) fn page_sql(catalog: &str, records: &str) -> String {
    page_where(catalog, records, "", "LIMIT $5 OFFSET $6")
}

/// [`page_sql`] by position: `$5` rows after the record created at `$6` with id `$7` (in the
/// list's order), with no limit on how far the list is paged.
pub(crate) fn after_sql(catalog: &str, records: &str) -> String {
    page_where(catalog, records, "AND (created_at, record_id) > ($6, $7)", "LIMIT $5")
}

fn page_where(catalog: &str, records: &str, condition: &str, window: &str) -> String {
    let schema_id = schema_id_subquery(catalog, "$3", "$4");
    let check = check_with(&format!(
        "{}, (SELECT total FROM {records}.record_counts WHERE space_id = $3 AND schema_id = {schema_id})",
        schema_type_column(catalog)
    ));
    format!(
        "WITH c AS ({check})
         SELECT c.*, p.doc, p.created_at, p.record_id FROM c LEFT JOIN LATERAL (
             SELECT doc, created_at, record_id FROM {records}.records
             WHERE space_id = $3 AND schema_id = {schema_id} {condition}
             ORDER BY created_at, record_id {window}) p ON true
         ORDER BY p.created_at, p.record_id"
    )
}

/// The record of schema `$4` (id or slug) in space `$3` that has every identity `$5[i]`
/// (`email`, `userId`, `phone`, `externalId`) with the value `$6[i]` (as stored), with the
/// consistency check: after its columns, the schema's type (null when it does not exist), the
/// number found (0 or 1) and the document (null when none). Found through the write side's
/// identity index (`record_identities`), read from the records read model.
pub(crate) fn by_identity_sql(catalog: &str, records: &str) -> String {
    let schema_id = schema_id_subquery(catalog, "$3", "$4");
    let found = format!(
        "SELECT r.doc FROM {records}.records r WHERE r.record_id IN (
             SELECT i.record_id FROM record_identities i
             JOIN unnest($5::text[], $6::text[]) AS w (kind, value) ON i.kind = w.kind AND i.value = w.value
             WHERE i.space_id = $3 AND i.schema_id = {schema_id}
             GROUP BY i.record_id HAVING count(*) = cardinality($5::text[]))"
    );
    let check = check_with(&format!("{}, (SELECT count(*) FROM ({found}) f)", schema_type_column(catalog)));
    format!("WITH c AS ({check}) SELECT c.*, p.doc FROM c LEFT JOIN LATERAL ({found}) p ON true")
}

/// The read columns of record `$5` of schema `$4` (id or slug) in space `$3`: the schema's
/// type (null when it does not exist) and the record's document (null when there is none).
pub(crate) fn record_columns(catalog: &str, records: &str) -> String {
    let schema_id = schema_id_subquery(catalog, "$3", "$4");
    format!(
        "{}, (SELECT doc FROM {records}.records WHERE record_id = $5 AND space_id = $3 AND schema_id = {schema_id})",
        schema_type_column(catalog)
    )
}

/// The type of schema `$4` (id or slug) of space `$3`, as a scalar subquery.
fn schema_type_column(catalog: &str) -> String {
    format!(
        "(SELECT schema_type FROM {catalog}.schemas WHERE space_id = $3 AND (schema_id = $4 OR slug = $4)
          ORDER BY (schema_id = $4) DESC LIMIT 1)"
    )
}
