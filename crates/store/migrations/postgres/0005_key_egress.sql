-- runcell store on PostgreSQL, schema version 5: a key's own egress bound (see the SQLite
-- migration 0006_key_egress.sql: the same rule; here an array of text, NULL for no bound of the
-- key's own, '{}' for no network at all).
ALTER TABLE api_keys ADD COLUMN egress_allow TEXT[]
    CHECK (egress_allow IS NULL OR array_position(egress_allow, NULL) IS NULL);
