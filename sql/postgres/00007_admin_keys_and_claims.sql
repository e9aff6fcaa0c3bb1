-- +goose Up
-- Admin writes a client may retry (PUT /admin/stock/{sku}, POST
-- /admin/stock/{sku}/restock) carry an Idempotency-Key as orders do. The
-- key is recorded in the transaction of the write it names, so a retry
-- whose first answer was lost finds it and applies nothing more; a key
-- reused with another body is refused. Unlike an order's key, a new sale
-- does not forget it (a retried restock must not land in the next sale):
-- keys are kept for a day (the write prunes older ones) and are one per
-- request, not per SKU.
CREATE TABLE admin_idempotency_keys (
    idempotency_key text        PRIMARY KEY,
    action          text        NOT NULL CHECK (action IN ('start', 'restock')),
    sku             text        NOT NULL,
    request_hash    bytea       NOT NULL,
    -- The sale the write started or restocked (stock.sale_epoch).
    sale_epoch      bigint      NOT NULL,
    -- The restock the key made (restocks.id); NULL for a start.
    restock_id      uuid,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX admin_idempotency_keys_created_idx ON admin_idempotency_keys (created_at);

-- Every restock is recorded, whatever the strategy, with its key: the
-- audit lists them, so a restock applied twice would show. Only the
-- reservation strategies' are marked for the relay.
ALTER TABLE restocks
    ADD COLUMN idempotency_key text,
    ADD COLUMN created_at timestamptz NOT NULL DEFAULT now();

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
ALTER TABLE orders ADD COLUMN claimed bigint NOT NULL DEFAULT 0 CHECK (claimed >= 0);
UPDATE orders o SET claimed = o.quantity
FROM buyer_units b
WHERE o.state = 'held' AND b.sku = o.sku AND b.user_id = o.user_id
  AND b.units >= (SELECT COALESCE(SUM(x.quantity), 0) FROM orders x
                  WHERE x.sku = o.sku AND x.user_id = o.user_id AND x.state IN ('final', 'held', 'paid'));

-- A buyer lists their orders (GET /orders?user_id=U[&sku=S]).
CREATE INDEX orders_user_idx ON orders (user_id, sku);

-- +goose Down
DROP INDEX orders_user_idx;
ALTER TABLE orders DROP COLUMN claimed;
ALTER TABLE restocks DROP COLUMN created_at, DROP COLUMN idempotency_key;
DROP TABLE admin_idempotency_keys;
