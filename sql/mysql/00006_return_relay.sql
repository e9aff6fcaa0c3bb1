-- +goose Up
-- The reservation strategies count stock in Redis: a cancel or an expiry
-- returns the units in the database (the order's conditional UPDATE, as
-- for every strategy) and marks the order here; the relay then gives the
-- units back to Redis, once per order (a set per sale there), and clears
-- the mark. The mark is the outbox: a return committed here reaches Redis
-- even if the instance that made it dies at once.
ALTER TABLE orders ADD COLUMN relay_pending BOOLEAN NOT NULL DEFAULT FALSE,
    ADD INDEX orders_relay_pending (relay_pending, sku);

-- A restock of such a sale is relayed the same way: its row here is the
-- outbox, applied once per sale in Redis (a set of restock ids there). A
-- new sale deletes the SKU's rows.
CREATE TABLE restocks (
    id            CHAR(36)    CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    sku           VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    quantity      BIGINT      NOT NULL CHECK (quantity > 0),
    relay_pending BOOLEAN     NOT NULL DEFAULT TRUE,
    INDEX restocks_sku (sku)
) ENGINE = InnoDB;

-- +goose Down
DROP TABLE restocks;
ALTER TABLE orders DROP INDEX orders_relay_pending, DROP COLUMN relay_pending;
