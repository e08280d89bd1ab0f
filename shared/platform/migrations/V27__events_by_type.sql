-- The log's events by type, in position order: each follower (a read model, the webhook
-- enqueue, the workflows' follower, preparation) reads only the events of its types between
-- its checkpoint and the head, rather than every event after its checkpoint. Positions up to
-- the head are all committed (every append moves the head under its row lock until COMMIT),
-- so a follower that reads up to the head it saw misses nothing it passes over.
CREATE INDEX events_type_position ON events (event_type, position);
