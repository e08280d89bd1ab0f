-- Write-side uniqueness of suppressions: one per (space or global, identifier, reason).
CREATE TABLE suppression_keys (
    scope text NOT NULL,
    identifier text NOT NULL,
    reason text NOT NULL,
    suppression_id text NOT NULL UNIQUE,
    PRIMARY KEY (scope, identifier, reason)
);
