-- runcell store, schema version 5: a key's approval default.

-- Whether the agent endpoints' cells (the chat, /anthropic, /openai/v1, /gemini, /mistral) wait
-- for a person's decision when a request made with this key does not say: 'always', 'never', or
-- NULL (no default: they do not wait). 'always' is a floor a request cannot lower
-- (`runcell keys create|update --approval`).
ALTER TABLE api_keys ADD COLUMN approval TEXT CHECK (approval IN ('never', 'always'));
