-- runcell store, schema version 2: tenants' quotas and default start, and how a session's
-- kernel starts.

-- A tenant's settings (`runcell keys create|update --max-sessions --max-memory-mb --start`): at
-- most max_sessions live sessions and max_memory_mb in the sum of their memory limits (NULL: no
-- quota), and how its Python sessions start when they do not say (NULL: from the zygote).
-- Every key of the tenant shares them; no row is no quota at all.
CREATE TABLE tenants (
    tenant         TEXT PRIMARY KEY,
    max_sessions   INTEGER CHECK (max_sessions >= 0),
    max_memory_mb  INTEGER CHECK (max_memory_mb >= 0),
    start          TEXT CHECK (start IN ('zygote', 'cold')),
    updated_at     TEXT NOT NULL
) STRICT;

-- "zygote" or "cold" (what the session asked for; a recovered cold session stays cold).
ALTER TABLE sessions ADD COLUMN start TEXT NOT NULL DEFAULT 'zygote';
