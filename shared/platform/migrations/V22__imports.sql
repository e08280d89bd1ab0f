-- Bulk imports (`/v1/imports`, `platform import`): the job, its parts as received, and one
-- result per row. The parts wait here, not in the log: they are the caller's file, personal
-- data in clear, and each part's body is dropped once the `imports` worker has decided all of
-- its rows. The rows' writes go to the log as ordinary record events; a row's result is
-- inserted by a guard of its own append, so a row has a result exactly when its write is in the
-- log (or it wrote nothing), and a worker killed mid-part resumes at the first row without one.
CREATE TABLE imports (
    space_id text NOT NULL,
    -- Chosen by the caller: a retried create with the same settings is the same import.
    import_id text NOT NULL,
    schema_id text NOT NULL,
    schema_type text NOT NULL,
    -- `csv` or `ndjson`.
    format text NOT NULL,
    -- `{fileName, consent: {label}, columns}` as given; the digest decides whether a repeated
    -- create is the same one.
    settings jsonb NOT NULL,
    settings_digest bytea NOT NULL,
    -- The API key that created it, or NULL for the operator CLI.
    actor_key_id text,
    created_at_ms bigint NOT NULL,
    -- Set by `complete`: no more parts; the import is completed once all of them are decided.
    parts_total integer,
    closed_at_ms bigint,
    PRIMARY KEY (space_id, import_id)
);

CREATE TABLE import_parts (
    space_id text NOT NULL,
    import_id text NOT NULL,
    part integer NOT NULL,
    -- NULL once every row of the part has a result.
    body bytea,
    digest bytea NOT NULL,
    rows integer NOT NULL,
    received_at_ms bigint NOT NULL,
    -- When its last row got its result.
    done_at_ms bigint,
    -- Results of the part's rows so far, kept by the worker.
    created integer NOT NULL DEFAULT 0,
    updated integer NOT NULL DEFAULT 0,
    unchanged integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    PRIMARY KEY (space_id, import_id, part),
    FOREIGN KEY (space_id, import_id) REFERENCES imports (space_id, import_id)
);

-- Parts waiting for the worker.
CREATE INDEX import_parts_waiting ON import_parts (received_at_ms) WHERE body IS NOT NULL;

CREATE TABLE import_rows (
    space_id text NOT NULL,
    import_id text NOT NULL,
    part integer NOT NULL,
    -- 1-based within the part (a CSV part's header is not a row).
    row_number integer NOT NULL,
    -- `created`, `updated`, `unchanged` or `failed`.
    status text NOT NULL,
    record_id text,
    -- The identity the row was matched by (`userId`, `email`, `phone`, `externalId`) and its
    -- value; the value is blanked when the record is deleted.
    key_field text,
    key_value text,
    -- A failed row's error: the contract's code and message; `warnings` of a written row.
    code text,
    message text,
    warnings jsonb,
    PRIMARY KEY (space_id, import_id, part, row_number)
);

CREATE INDEX import_rows_record ON import_rows (record_id) WHERE record_id IS NOT NULL;
