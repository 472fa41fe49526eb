-- runcell store on PostgreSQL, schema version 3: what a layer above the engine keeps with a
-- session.

-- One JSON document per (session, kind), written by the HTTP layer (kind `e2b`: an E2B
-- sandbox's data-plane access token, template, variables and what it does at its timeout), so
-- that a server that restarts, or another node, still knows it. Removed with the session.
CREATE TABLE session_extras (
    session_id  TEXT COLLATE "C" NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    kind        TEXT COLLATE "C" NOT NULL,
    data_json   TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (session_id, kind)
);
