-- Fixed-window request counters shared by every instance. UNLOGGED: no WAL per request; the
-- counters are lost in a database crash, which only resets the current windows.
CREATE UNLOGGED TABLE rate_windows (
    bucket_key text NOT NULL,
    window_index bigint NOT NULL,
    count integer NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (bucket_key, window_index)
);
CREATE INDEX rate_windows_expiry ON rate_windows (expires_at);
