-- Opens and clicks as the tracking endpoints take them in: one committed row each, before
-- the pixel or the redirect is answered, so none acknowledged is lost. The `engagement`
-- worker decides them against the email's stream and appends `EmailOpened` or
-- `EmailClicked` with the rows' deletion, in one transaction. A click's target is sealed
-- under a key derived from the master key (the email's id bound in) until then; the client's
-- address and user agent are never stored, only the signal the request alone gave away.
CREATE TABLE engagement_inbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email_id text NOT NULL,
    -- `open` or `click`.
    kind text NOT NULL,
    -- A click's target, sealed; NULL for an open.
    link bytea,
    -- A click's keyed digest of its target; empty for an open.
    link_id text NOT NULL DEFAULT '',
    -- `head`, `no_user_agent`, `privacy_proxy` or `known_bot`; empty when the request looked
    -- like a person's (its timing is judged by the worker).
    signal text NOT NULL DEFAULT '',
    at_ms bigint NOT NULL
);
