-- The segment triggers of published workflows that the engine's log follower follows: for
-- each (workflow, segment), the log position through which the segment's entries (as the
-- segments read model records them) have been handled. A trigger's row is made when the
-- follower first sees it published, starting at the position of the definition that published
-- it, so contacts that were members before then start nothing; it goes when the trigger is no
-- longer published.
CREATE TABLE workflow_segment_triggers (
    workflow_id text NOT NULL,
    segment_id text NOT NULL,
    through bigint NOT NULL,
    PRIMARY KEY (workflow_id, segment_id)
);
