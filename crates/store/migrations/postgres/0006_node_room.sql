-- runcell store on PostgreSQL, schema version 6: the room each node has left for new sessions,
-- written with its heartbeat, so any node can place a new session on the live node with the
-- most room (docs/scale.md, "Placement").

-- MiB the node can still commit to sandboxes (its --max-committed-memory-mb less what its
-- live sessions, warm ones and one-shot runs hold).
ALTER TABLE nodes ADD COLUMN free_memory_mb BIGINT;
-- Sessions it can still start under its --max-sessions; NULL: no such cap.
ALTER TABLE nodes ADD COLUMN free_sessions BIGINT;
-- When the room was last written; NULL: never (a node of an older runcell, or one still
-- starting), and such a node is not chosen for new sessions.
ALTER TABLE nodes ADD COLUMN room_at TIMESTAMPTZ;
