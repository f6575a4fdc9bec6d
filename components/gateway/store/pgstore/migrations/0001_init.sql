-- bcgw's store, first schema. Each record column holds the same JSON the
-- bbolt store keeps (as bytes: read it with convert_from(record, 'UTF8')::json);
-- the columns beside it are what queries and constraints need.

CREATE TABLE tokens (
    id     text PRIMARY KEY,
    record bytea NOT NULL
);

CREATE TABLE nodes (
    id     text PRIMARY KEY,
    record bytea NOT NULL
);

CREATE TABLE commands (
    id         text PRIMARY KEY,
    node_id    text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    state      text NOT NULL CHECK (state IN ('pending', 'delivered', 'done')),
    created_at timestamptz NOT NULL,
    record     bytea NOT NULL
);
-- Unfinished(node): the commands without a result, oldest first.
CREATE INDEX commands_unfinished ON commands (node_id, created_at, id) WHERE state <> 'done';

-- The gateway's own small values. Keys compare bytewise (collation C) so
-- a prefix is a key range.
CREATE TABLE meta (
    key   text COLLATE "C" PRIMARY KEY,
    value bytea NOT NULL
);

CREATE TABLE specs (
    node_id    text PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    generation bigint NOT NULL CHECK (generation > 0),
    record     bytea NOT NULL
);

CREATE TABLE reports (
    node_id text PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    record  bytea NOT NULL
);

-- An agent's seq is any uint64: numeric(20) holds and orders all of them.
CREATE TABLE events (
    node_id text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    seq     numeric(20, 0) NOT NULL CHECK (seq >= 0),
    record  bytea NOT NULL,
    PRIMARY KEY (node_id, seq)
);
