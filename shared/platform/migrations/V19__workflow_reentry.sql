-- A trigger's re-entry rule counts every run of the workflow for the contact, whatever started
-- it (the API's trigger of the incoming webhook, an event, a segment): it reads the runs
-- themselves, so the list of trigger-started runs is gone.
CREATE INDEX workflow_runs_of_workflow_contact ON workflow_runs (workflow_id, contact_id);
DROP TABLE workflow_entries;
