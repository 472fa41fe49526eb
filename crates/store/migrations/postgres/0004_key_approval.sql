-- runcell store on PostgreSQL, schema version 4: a key's approval default (see the SQLite
-- migration 0005_key_approval.sql: the same column, the same rule).
ALTER TABLE api_keys ADD COLUMN approval TEXT CHECK (approval IN ('never', 'always'));
