-- runcell store on PostgreSQL, schema version 2: the nodes sharing the database, and which
-- node owns each session.

-- Every `runcell serve` on this database: registered when it starts (its epoch one more than
-- the last of that id), then a heartbeat every 2 s. A node whose heartbeat is over 10 s old
-- is dead: its sessions read as `dead` through every node. Times are the database's clock
-- (now()), so the nodes' clocks need not agree.
CREATE TABLE nodes (
    id            TEXT COLLATE "C" PRIMARY KEY,   -- --node-url, or host name and data dir
    epoch         BIGINT NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL,
    heartbeat_at  TIMESTAMPTZ NOT NULL
);

-- The node that runs the session (NULL: written by a command that is no node), and the
-- epoch it had then: a node's later epoch takes its earlier epochs' sessions over, and an
-- earlier one can then no longer change them.
ALTER TABLE sessions ADD COLUMN owner_node TEXT COLLATE "C";
ALTER TABLE sessions ADD COLUMN owner_epoch BIGINT;
CREATE INDEX sessions_by_owner ON sessions (owner_node, status);
