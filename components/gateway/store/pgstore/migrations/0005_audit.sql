-- The audit trail of admin API calls that change state (who, what, on
-- what, how it ended), and the newest commands across nodes for the fleet
-- page.
CREATE TABLE audit (
    seq    bigserial PRIMARY KEY,
    record bytea NOT NULL
);
CREATE INDEX commands_recent ON commands (created_at DESC, id DESC);
