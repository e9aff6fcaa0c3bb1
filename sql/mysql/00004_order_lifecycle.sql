-- +goose Up
-- Orders that come back (HOLD_TTL): an order is held until it is paid,
-- cancelled or its hold lapses (expires_at, on the database's clock), and
-- settled_at is when it left held. Rows written before this migration, and
-- every order placed with HOLD_TTL=0, are 'final'. Each transition is one
-- conditional UPDATE ... WHERE state = 'held', and the units of a cancelled
-- or expired order go back in the transaction that moved it, so an order
-- leaves held once and its units come back once. The times are DATETIME in
-- UTC, written and compared with UTC_TIMESTAMP(6): no session time zone
-- can shift them.
ALTER TABLE orders
    ADD COLUMN state VARCHAR(9) CHARACTER SET ascii NOT NULL DEFAULT 'final'
        CHECK (state IN ('final', 'held', 'paid', 'cancelled', 'expired')),
    ADD COLUMN expires_at DATETIME(6) NULL DEFAULT NULL,
    ADD COLUMN settled_at DATETIME(6) NULL DEFAULT NULL,
    -- The sweep's: the lapsed holds, oldest first.
    ADD KEY orders_held_expiry_idx (state, expires_at);

-- +goose Down
ALTER TABLE orders DROP KEY orders_held_expiry_idx, DROP COLUMN settled_at,
    DROP COLUMN expires_at, DROP COLUMN state;
