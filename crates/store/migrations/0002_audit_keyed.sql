-- runcell store, schema version 2: the keyed audit chain (see src/audit.rs).
-- Rows appended from now on are HMAC-SHA-256 under a key kept outside this file.

-- Which chain key this database is keyed with (its public id, never the key), so a store
-- opened with another key refuses to extend the chains with it.
CREATE TABLE audit_keying (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    key_id      TEXT NOT NULL,
    keyed_at    TEXT NOT NULL
) STRICT;

-- Per tenant, the last unkeyed (SHA-256) record when the chain key was created: rows up to
-- `seq` are checked as SHA-256, later ones as HMAC. `mac` is an HMAC of (tenant, seq, hash)
-- under the chain key, so this boundary cannot be moved without the key.
CREATE TABLE audit_legacy (
    tenant  TEXT PRIMARY KEY,
    seq     INTEGER NOT NULL,
    hash    TEXT NOT NULL,
    mac     TEXT NOT NULL
) STRICT;
