-- runcell store on PostgreSQL, schema version 1: what SQLite's migrations 1 to 3 make, in
-- PostgreSQL's words. Records mean the same in both backends (see ../0001_init.sql for each
-- column's story); the differences are PostgreSQL's: BIGINT for integers, and COLLATE "C" on
-- the text that is sorted, so rows come back in the same (byte) order as from SQLite.
-- Timestamps stay RFC 3339 text with nine fractional digits: timestamptz keeps microseconds
-- only, and the audit chain hashes the stored text exactly.

CREATE TABLE api_keys (
    id          TEXT COLLATE "C" PRIMARY KEY,
    name        TEXT COLLATE "C" NOT NULL,
    tenant      TEXT COLLATE "C" NOT NULL,
    key_hash    TEXT NOT NULL UNIQUE,      -- lowercase hex sha256 of the plaintext key
    prefix      TEXT NOT NULL,
    created_at  TEXT COLLATE "C" NOT NULL,
    revoked_at  TEXT
);
CREATE INDEX api_keys_by_name ON api_keys (name);

CREATE TABLE sessions (
    id              TEXT COLLATE "C" PRIMARY KEY,
    tenant          TEXT COLLATE "C" NOT NULL,
    language        TEXT NOT NULL,
    status          TEXT NOT NULL,
    created_at      TEXT COLLATE "C" NOT NULL,
    last_active_at  TEXT NOT NULL,
    expires_at      TEXT NOT NULL,
    limits_json     TEXT NOT NULL,
    metadata_json   TEXT NOT NULL,
    workspace_path  TEXT NOT NULL,
    start           TEXT NOT NULL DEFAULT 'zygote'
);
CREATE INDEX sessions_by_tenant ON sessions (tenant, created_at);
CREATE INDEX sessions_by_status ON sessions (status);

CREATE TABLE uploads (
    session_id   TEXT COLLATE "C" NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    path         TEXT COLLATE "C" NOT NULL,
    size         BIGINT NOT NULL CHECK (size >= 0),
    sha256       TEXT NOT NULL,
    uploaded_at  TEXT NOT NULL,
    PRIMARY KEY (session_id, path)
);

-- The audit log: one keyed hash chain per tenant (src/audit.rs). Several nodes append to
-- it: each append locks its tenant's chain_heads row first (SELECT ... FOR UPDATE), so the
-- chain never forks.
CREATE TABLE executions (
    tenant          TEXT COLLATE "C" NOT NULL,
    seq             BIGINT NOT NULL,
    execution_id    TEXT COLLATE "C" NOT NULL UNIQUE,
    session_id      TEXT COLLATE "C",
    status          TEXT NOT NULL,
    code            TEXT NOT NULL,
    execution_json  TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    prev_hash       TEXT NOT NULL,
    hash            TEXT NOT NULL,
    PRIMARY KEY (tenant, seq)
);
CREATE INDEX executions_by_session ON executions (tenant, session_id, seq);

CREATE TABLE chain_heads (
    tenant  TEXT COLLATE "C" PRIMARY KEY,
    seq     BIGINT NOT NULL,
    hash    TEXT NOT NULL
);

-- Which chain key the database is keyed with (its public id, never the key): every node
-- must be given the same key file.
CREATE TABLE audit_keying (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    key_id      TEXT NOT NULL,
    keyed_at    TEXT NOT NULL
);

CREATE TABLE tenants (
    tenant         TEXT COLLATE "C" PRIMARY KEY,
    max_sessions   BIGINT CHECK (max_sessions >= 0),
    max_memory_mb  BIGINT CHECK (max_memory_mb >= 0),
    start          TEXT CHECK (start IN ('zygote', 'cold')),
    updated_at     TEXT NOT NULL
);

-- The log is append-only for this program (the chain is what detects anyone who drops these).
CREATE FUNCTION runcell_executions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'executions are append-only';
END
$$;
CREATE TRIGGER executions_no_update BEFORE UPDATE OR DELETE ON executions
    FOR EACH ROW EXECUTE FUNCTION runcell_executions_append_only();
CREATE TRIGGER executions_no_truncate BEFORE TRUNCATE ON executions
    FOR EACH STATEMENT EXECUTE FUNCTION runcell_executions_append_only();
