-- runcell store, schema version 6: a key's own egress bound.

-- The domain patterns (a JSON array of strings, e.g. '["pypi.org","*.example.com"]') a session
-- or run asked for with this key must stay within, on top of the server's `serve --egress-allow`:
-- a key only narrows the server's bound. NULL: no bound of its own (the server's); '[]': no
-- network at all (`runcell keys create|update --egress-allow`). The patterns are checked and
-- normalized by the CLI before they are written here.
ALTER TABLE api_keys ADD COLUMN egress_allow TEXT
    CHECK (egress_allow IS NULL OR (json_valid(egress_allow) AND json_type(egress_allow) = 'array'));
