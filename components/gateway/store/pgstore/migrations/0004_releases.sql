-- Published self-update releases, so every gateway sharing the database
-- serves them: each version's signed document as published, and the
-- binaries by SHA-256 (a binary may belong to several releases).
CREATE TABLE releases (
    version   text PRIMARY KEY,
    doc       bytea NOT NULL,
    published timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE release_artifacts (
    sha256 text PRIMARY KEY,
    data   bytea NOT NULL
);
