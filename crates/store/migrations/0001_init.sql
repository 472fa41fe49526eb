-- runcell store, schema version 1.
-- Every table is STRICT so a value of the wrong type cannot be stored.
-- Timestamps are RFC 3339 UTC text with exactly nine fractional digits
-- ("2024-05-01T12:00:00.123456789Z"): fixed width, so text order is time order.

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,          -- "key_" + 16 base62 chars
    name        TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    key_hash    TEXT NOT NULL UNIQUE,      -- lowercase hex sha256 of the plaintext key
    prefix      TEXT NOT NULL,             -- first 7 chars of the key, for display
    created_at  TEXT NOT NULL,
    revoked_at  TEXT
) STRICT;
CREATE INDEX api_keys_by_name ON api_keys (name);

CREATE TABLE sessions (
    id              TEXT PRIMARY KEY,
    tenant          TEXT NOT NULL,
    language        TEXT NOT NULL,
    status          TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    last_active_at  TEXT NOT NULL,
    expires_at      TEXT NOT NULL,
    limits_json     TEXT NOT NULL,
    metadata_json   TEXT NOT NULL,
    workspace_path  TEXT NOT NULL
) STRICT;
CREATE INDEX sessions_by_tenant ON sessions (tenant, created_at);
CREATE INDEX sessions_by_status ON sessions (status);

-- Latest upload per (session, path); removed with the session.
CREATE TABLE uploads (
    session_id   TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    path         TEXT NOT NULL,
    size         INTEGER NOT NULL,
    sha256       TEXT NOT NULL,
    uploaded_at  TEXT NOT NULL,
    PRIMARY KEY (session_id, path)
) STRICT;

-- The audit log: one hash chain per tenant (see src/audit.rs for the hashed encoding).
-- Executions outlive their sessions, so session_id is not a foreign key.
CREATE TABLE executions (
    tenant          TEXT NOT NULL,
    seq             INTEGER NOT NULL,      -- 1, 2, 3, ... per tenant
    execution_id    TEXT NOT NULL UNIQUE,
    session_id      TEXT,
    status          TEXT NOT NULL,
    code            TEXT NOT NULL,
    execution_json  TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    prev_hash       TEXT NOT NULL,         -- hash of row seq-1 (64 zeros for seq 1)
    hash            TEXT NOT NULL,
    PRIMARY KEY (tenant, seq)
) STRICT;
CREATE INDEX executions_by_session ON executions (tenant, session_id, seq);

-- The last (seq, hash) appended per tenant; lets verification notice a deleted last row.
CREATE TABLE chain_heads (
    tenant  TEXT PRIMARY KEY,
    seq     INTEGER NOT NULL,
    hash    TEXT NOT NULL
) STRICT;

-- The log is append-only for this program. (Anyone with write access to the file can drop
-- these triggers; the hash chain is what detects that kind of tampering.)
CREATE TRIGGER executions_no_update BEFORE UPDATE ON executions
BEGIN
    SELECT RAISE(ABORT, 'executions are append-only');
END;
CREATE TRIGGER executions_no_delete BEFORE DELETE ON executions
BEGIN
    SELECT RAISE(ABORT, 'executions are append-only');
END;
