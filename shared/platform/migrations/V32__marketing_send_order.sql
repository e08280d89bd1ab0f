-- The order of each contact's marketing sends, so that two sends decided at the same moment
-- from the same reading cannot both pass a frequency cap: a send decided under caps records
-- `seq` as one past the contact's last send the decision read, and the unique index lets only
-- one of two such appends commit; the other decides again. A send decided without caps
-- records none (NULLs never collide).
ALTER TABLE marketing_sends ADD COLUMN seq bigint;

UPDATE marketing_sends m SET seq = ordered.seq
FROM (SELECT contact_id, at_ms, email_id,
             row_number() OVER (PARTITION BY contact_id ORDER BY at_ms, email_id) AS seq
      FROM marketing_sends) ordered
WHERE m.contact_id = ordered.contact_id AND m.at_ms = ordered.at_ms AND m.email_id = ordered.email_id;

CREATE UNIQUE INDEX marketing_sends_order ON marketing_sends (contact_id, seq);
