-- The floor of an import under this design: the time PostgreSQL takes to write the rows that
-- an import of new contacts leaves behind (each contact's event, stream, identity claim, data
-- key and result row, and its documents in the records and segments read models), copied from
-- the import named by :import_id into empty tables of the same shape and indexes, one
-- statement per table, in one transaction, with no decision, no read and no application.
--
--   psql -v import_id=ID -tA -f scripts/import-floor.sql   (prints "rows seconds")
--
-- With -v least=1 it writes only what any event-sourced import with crypto-shredding must
-- write per contact (the floor the import's target is set against): the log event, the
-- identity claim, the data key and one read-model document; no stream row, no result row, no
-- second document.
--
-- Nothing is left behind: the twin tables live in a schema dropped at the end.
\set ON_ERROR_STOP on
\if :{?least}
\else
\set least 0
\endif
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS import_floor CASCADE;
CREATE SCHEMA import_floor;
SELECT format('rm_%s_v%s', name, version) AS records_schema FROM projections
    WHERE name = 'records' AND status = 'live' \gset
SELECT format('rm_%s_v%s', name, version) AS segments_schema FROM projections
    WHERE name = 'segments' AND status = 'live' \gset
CREATE TEMP TABLE floor_ids AS
    SELECT record_id FROM import_rows WHERE import_id = :'import_id' AND status = 'created';
CREATE TEMP TABLE floor_events AS
    SELECT e.* FROM events e JOIN floor_ids i ON e.stream_id = 'record/' || i.record_id AND e.stream_version = 1;
CREATE TEMP TABLE floor_streams AS
    SELECT s.* FROM streams s JOIN floor_ids i ON s.stream_id = 'record/' || i.record_id;
CREATE TEMP TABLE floor_identities AS
    SELECT r.* FROM record_identities r JOIN floor_ids USING (record_id);
CREATE TEMP TABLE floor_keys AS
    SELECT k.* FROM subject_keys k JOIN floor_ids i ON k.subject_id = i.record_id;
CREATE TEMP TABLE floor_results AS
    SELECT r.* FROM import_rows r WHERE import_id = :'import_id' AND status = 'created';
CREATE TEMP TABLE floor_records AS
    SELECT r.* FROM :"records_schema".records r JOIN floor_ids USING (record_id);
CREATE TEMP TABLE floor_contacts AS
    SELECT c.* FROM :"segments_schema".contacts c JOIN floor_ids i ON c.contact_id = i.record_id;
CREATE TABLE import_floor.events (LIKE events INCLUDING ALL);
CREATE TABLE import_floor.streams (LIKE streams INCLUDING ALL);
CREATE TABLE import_floor.record_identities (LIKE record_identities INCLUDING ALL);
CREATE TABLE import_floor.subject_keys (LIKE subject_keys INCLUDING ALL);
CREATE TABLE import_floor.import_rows (LIKE import_rows INCLUDING ALL);
CREATE TABLE import_floor.records (LIKE :"records_schema".records INCLUDING ALL);
CREATE TABLE import_floor.contacts (LIKE :"segments_schema".contacts INCLUDING ALL);
CHECKPOINT;
SELECT extract(epoch FROM clock_timestamp()) AS started \gset
BEGIN;
INSERT INTO import_floor.events SELECT * FROM floor_events;
INSERT INTO import_floor.record_identities SELECT * FROM floor_identities;
INSERT INTO import_floor.subject_keys SELECT * FROM floor_keys;
INSERT INTO import_floor.records SELECT * FROM floor_records;
\if :least
\else
INSERT INTO import_floor.streams SELECT * FROM floor_streams;
INSERT INTO import_floor.import_rows SELECT * FROM floor_results;
INSERT INTO import_floor.contacts SELECT * FROM floor_contacts;
\endif
COMMIT;
SELECT (SELECT count(*) FROM floor_ids) || ' ' || round((extract(epoch FROM clock_timestamp()) - :started)::numeric, 3);
DROP SCHEMA import_floor CASCADE;
