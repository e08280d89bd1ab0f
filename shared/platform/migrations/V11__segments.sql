-- Segments: a webhook's segment condition is matched by the enqueue worker against the
-- `segments` read model's membership.
ALTER TABLE webhook_endpoints ADD COLUMN segment_id text;
