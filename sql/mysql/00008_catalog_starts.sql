-- +goose Up
-- PUT /admin/stock puts many SKUs on sale in one request and one
-- transaction; its Idempotency-Key is one record for the whole request
-- (action 'catalog', sku '' and sale_epoch 0: the request names many).
-- MariaDB names a column's CHECK after the column; MODIFY replaces it.
ALTER TABLE admin_idempotency_keys
    MODIFY action VARCHAR(7) CHARACTER SET ascii NOT NULL CHECK (action IN ('start', 'restock', 'catalog'));

-- +goose Down
DELETE FROM admin_idempotency_keys WHERE action = 'catalog';
ALTER TABLE admin_idempotency_keys
    MODIFY action VARCHAR(7) CHARACTER SET ascii NOT NULL CHECK (action IN ('start', 'restock'));
