-- Keys: the gateways' long-lived keys (CAs, join, command, workload,
-- SSH user CA and ticket keys), each sealed under the fleet's
-- key-encryption key with AES-256-GCM (components/gateway/kek); the
-- database holds no key in the clear. gateway_kek has at most one row:
-- the fingerprint of the key-encryption key the set is sealed under, so a
-- gateway given another one is told so. Both are written once, in one
-- transaction, by the first gateway to start (pgstore.AddKeysIfAbsent).
CREATE TABLE gateway_kek (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    fingerprint text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE gateway_keys (
    name    text COLLATE "C" PRIMARY KEY,
    version integer NOT NULL CHECK (version > 0),
    sealed  bytea NOT NULL
);
