-- +goose Up
-- Orders that come back (HOLD_TTL): an order is held until it is paid,
-- cancelled or its hold lapses (expires_at, on the database's clock), and
-- settled_at is when it left held. Rows written before this migration, and
-- every order placed with HOLD_TTL=0, are 'final'. Each transition is one
-- conditional UPDATE ... WHERE state = 'held', and the units of a cancelled
-- or expired order go back in the transaction that moved it, so an order
-- leaves held once and its units come back once.
ALTER TABLE orders
    ADD COLUMN state text NOT NULL DEFAULT 'final'
        CHECK (state IN ('final', 'held', 'paid', 'cancelled', 'expired')),
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN settled_at timestamptz;
-- The sweep's: the lapsed holds, oldest first, and nothing else.
CREATE INDEX orders_held_expiry_idx ON orders (expires_at) WHERE state = 'held';

-- +goose Down
DROP INDEX orders_held_expiry_idx;
ALTER TABLE orders DROP COLUMN settled_at, DROP COLUMN expires_at, DROP COLUMN state;
