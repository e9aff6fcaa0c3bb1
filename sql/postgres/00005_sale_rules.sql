-- +goose Up
-- PER_USER_LIMIT: the units each buyer holds or has paid for in the SKU's
-- current sale (a new sale deletes the SKU's rows, as it deletes its
-- orders). An order claims its units with one conditional upsert in its own
-- transaction (units + q <= the limit), so two orders of one buyer on two
-- instances queue on this row and at most the limit is taken; a cancel or
-- an expiry gives them back in the transaction that returns the stock.
CREATE TABLE buyer_units (
    sku     text   NOT NULL,
    user_id text   NOT NULL,
    units   bigint NOT NULL CHECK (units >= 0),
    PRIMARY KEY (sku, user_id)
);

-- A restock adds units to the current sale without deleting its orders:
-- the audit becomes initial + restocked = available + held + paid.
ALTER TABLE stock ADD COLUMN restocked bigint NOT NULL DEFAULT 0;

-- Sale windows: before starts_at and from ends_at on (the database's
-- clock), orders are refused and nothing changes. NULL: no bound.
ALTER TABLE stock ADD COLUMN starts_at timestamptz, ADD COLUMN ends_at timestamptz;

-- +goose Down
ALTER TABLE stock DROP COLUMN ends_at, DROP COLUMN starts_at, DROP COLUMN restocked;
DROP TABLE buyer_units;
