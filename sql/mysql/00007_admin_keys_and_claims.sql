-- +goose Up
-- Admin writes a client may retry (PUT /admin/stock/{sku}, POST
-- /admin/stock/{sku}/restock) carry an Idempotency-Key as orders do. The
-- key is recorded in the transaction of the write it names, so a retry
-- whose first answer was lost finds it and applies nothing more; a key
-- reused with another body is refused. Unlike an order's key, a new sale
-- does not forget it (a retried restock must not land in the next sale):
-- keys are kept for a day (the write prunes older ones) and are one per
-- request, not per SKU. Times in UTC (UTC_TIMESTAMP).
CREATE TABLE admin_idempotency_keys (
    idempotency_key VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    action          VARCHAR(7)   CHARACTER SET ascii NOT NULL CHECK (action IN ('start', 'restock')),
    sku             VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    request_hash    BINARY(32)   NOT NULL,
    -- The sale the write started or restocked (stock.sale_epoch).
    sale_epoch      BIGINT       NOT NULL,
    -- The restock the key made (restocks.id); NULL for a start.
    restock_id      CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NULL,
    created_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY admin_idempotency_keys_created_idx (created_at)
) ENGINE = InnoDB;

-- Every restock is recorded, whatever the strategy, with its key: the
-- audit lists them, so a restock applied twice would show. Only the
-- reservation strategies' are marked for the relay.
ALTER TABLE restocks
    ADD COLUMN idempotency_key VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL,
    ADD COLUMN created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6));

-- The units an order added to its buyer's count (PER_USER_LIMIT): its
-- cancel or expiry gives back exactly these, so a count never falls below
-- what the buyer's counted orders hold, whatever limit each instance runs
-- with (an order taken without a limit claims nothing and gives nothing
-- back). Which orders written before this migration were counted is not
-- known: a held order claims its quantity only when its buyer's count
-- covers every order of the buyer in the sale (all were counted, as they
-- are when every instance runs one limit); otherwise it claims nothing,
-- and its cancel leaves the count as it is (stricter, never below what the
-- counted orders hold, never a cancel refused).
ALTER TABLE orders ADD COLUMN claimed BIGINT NOT NULL DEFAULT 0 CHECK (claimed >= 0),
    -- A buyer lists their orders (GET /orders?user_id=U[&sku=S]).
    ADD KEY orders_user_idx (user_id, sku);
UPDATE orders o
    JOIN buyer_units b ON b.sku = o.sku AND b.user_id = o.user_id
    JOIN (SELECT sku, user_id, SUM(quantity) AS held FROM orders
          WHERE state IN ('final', 'held', 'paid') GROUP BY sku, user_id) t
      ON t.sku = o.sku AND t.user_id = o.user_id
SET o.claimed = o.quantity
WHERE o.state = 'held' AND b.units >= t.held;

-- +goose Down
ALTER TABLE orders DROP KEY orders_user_idx, DROP COLUMN claimed;
ALTER TABLE restocks DROP COLUMN created_at, DROP COLUMN idempotency_key;
DROP TABLE admin_idempotency_keys;
