-- +goose Up
-- The reservation strategies count stock in Redis: a cancel or an expiry
-- returns the units in the database (the order's conditional UPDATE, as
-- for every strategy) and marks the order here; the relay then gives the
-- units back to Redis, once per order (a set per sale there), and clears
-- the mark. The mark is the outbox: a return committed here reaches Redis
-- even if the instance that made it dies at once.
ALTER TABLE orders ADD COLUMN relay_pending boolean NOT NULL DEFAULT false;
CREATE INDEX orders_relay_pending ON orders (sku) WHERE relay_pending;

-- A restock of such a sale is relayed the same way: its row here is the
-- outbox, applied once per sale in Redis (a set of restock ids there). A
-- new sale deletes the SKU's rows.
CREATE TABLE restocks (
    id            uuid    PRIMARY KEY,
    sku           text    NOT NULL,
    quantity      bigint  NOT NULL CHECK (quantity > 0),
    relay_pending boolean NOT NULL DEFAULT true
);
CREATE INDEX restocks_sku ON restocks (sku);

-- +goose Down
DROP TABLE restocks;
DROP INDEX orders_relay_pending;
ALTER TABLE orders DROP COLUMN relay_pending;
