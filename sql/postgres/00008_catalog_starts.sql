-- +goose Up
-- PUT /admin/stock puts many SKUs on sale in one request and one
-- transaction; its Idempotency-Key is one record for the whole request
-- (action 'catalog', sku '' and sale_epoch 0: the request names many).
ALTER TABLE admin_idempotency_keys
    DROP CONSTRAINT admin_idempotency_keys_action_check,
    ADD CONSTRAINT admin_idempotency_keys_action_check CHECK (action IN ('start', 'restock', 'catalog'));

-- +goose Down
DELETE FROM admin_idempotency_keys WHERE action = 'catalog';
ALTER TABLE admin_idempotency_keys
    DROP CONSTRAINT admin_idempotency_keys_action_check,
    ADD CONSTRAINT admin_idempotency_keys_action_check CHECK (action IN ('start', 'restock'));
