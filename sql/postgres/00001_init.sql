-- +goose Up
-- One row per SKU. There is deliberately no CHECK (available >= 0): the
-- strategies must keep stock non-negative by themselves, and the naive
-- control has to be able to show what overselling looks like. Production
-- should add the constraint as a last line of defence (see README).
CREATE TABLE stock (
    sku        text        PRIMARY KEY,
    initial    bigint      NOT NULL,
    available  bigint      NOT NULL,
    -- Bumped by every deduction, so version-CAS stays correct even when
    -- instances with other strategies write the same row.
    version    bigint      NOT NULL DEFAULT 0,
    -- Highest lock fencing token that has written this row (lock strategies).
    fence      bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Every unit sold is one order row, written in the same transaction as the
-- deduction.
CREATE TABLE orders (
    id         uuid        PRIMARY KEY,
    sku        text        NOT NULL,
    quantity   integer     NOT NULL,
    user_id    text        NOT NULL,
    strategy   text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX orders_sku_idx ON orders (sku);

-- The order created for a request that carried an Idempotency-Key, written in
-- the transaction of the order it describes.
CREATE TABLE idempotency_keys (
    idempotency_key text        PRIMARY KEY,
    sku             text        NOT NULL,
    request_hash    bytea       NOT NULL,
    order_id        uuid        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idempotency_keys_sku_idx ON idempotency_keys (sku);

-- +goose Down
DROP TABLE idempotency_keys;
DROP TABLE orders;
DROP TABLE stock;
