-- Leases: what must have one owner across the gateways sharing this
-- database (a site's boot lease). A row is held by holder until expires;
-- an expired row is free for anyone. Times are the gateways' clocks.
CREATE TABLE leases (
    name    text PRIMARY KEY,
    holder  text NOT NULL,
    expires timestamptz NOT NULL
);
