-- A click's link position: which tracked link of the email it was (1 = the first in the HTML
-- part), the same for every recipient of a template whatever their rendered targets; what
-- per-link results count by. 0 for a link sent before positions were numbered.
ALTER TABLE engagement_inbox ADD COLUMN link_position integer NOT NULL DEFAULT 0;
