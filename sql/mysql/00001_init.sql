-- +goose Up
-- One row per SKU. There is deliberately no CHECK (available >= 0): the
-- strategies must keep stock non-negative by themselves, and the naive
-- control has to be able to show what overselling looks like. Production
-- should add the constraint as a last line of defence (see README).
-- SKUs and keys are ASCII with a binary collation, so they compare exactly
-- as they do in PostgreSQL ("S-1" is not "s-1").
CREATE TABLE stock (
    sku        VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    initial    BIGINT       NOT NULL,
    available  BIGINT       NOT NULL,
    -- Bumped by every deduction, so version-CAS stays correct even when
    -- instances with other strategies write the same row.
    version    BIGINT       NOT NULL DEFAULT 0,
    -- Highest lock fencing token that has written this row (lock strategies).
    fence      BIGINT       NOT NULL DEFAULT 0,
    updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB;

-- Every unit sold is one order row, written in the same transaction as the
-- deduction.
CREATE TABLE orders (
    id         CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    sku        VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    quantity   INT          NOT NULL,
    user_id    VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    strategy   VARCHAR(32)  CHARACTER SET ascii NOT NULL,
    created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY orders_sku_idx (sku)
) ENGINE = InnoDB;

-- The order created for a request that carried an Idempotency-Key, written in
-- the transaction of the order it describes.
CREATE TABLE idempotency_keys (
    idempotency_key VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    sku             VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    request_hash    BINARY(32)   NOT NULL,
    order_id        CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    created_at      TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY idempotency_keys_sku_idx (sku)
) ENGINE = InnoDB;

-- +goose Down
DROP TABLE idempotency_keys;
DROP TABLE orders;
DROP TABLE stock;
