-- runcell store, schema version 2: tenants' quotas and how a session's kernel starts.

-- A tenant's quota (`runcell keys create|update --max-sessions --max-memory-mb`): at most
-- max_sessions live sessions and max_memory_mb in the sum of their memory limits. NULL is no
-- quota. Every key of the tenant shares it; no row is no quota at all.
CREATE TABLE tenant_quotas (
    tenant         TEXT PRIMARY KEY,
    max_sessions   INTEGER CHECK (max_sessions >= 0),
    max_memory_mb  INTEGER CHECK (max_memory_mb >= 0),
    updated_at     TEXT NOT NULL
) STRICT;

-- "zygote" or "cold" (what the session asked for; a recovered cold session stays cold).
ALTER TABLE sessions ADD COLUMN start TEXT NOT NULL DEFAULT 'zygote';
