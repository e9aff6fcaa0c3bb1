-- +goose Up
-- The number of the SKU's current sale: every StartSale moves it to the
-- next multiple of 2^20, and a check of a restarted Redis adds one (the
-- sale renumbered, its stock and orders kept). The
-- redis-reserve strategy stamps each order it reserves in Redis with it, and
-- writes an order into the database only while the row still has that
-- number, so an order reserved in a sale that was restarted since (and
-- forgotten with it) never lands in the next one.
ALTER TABLE stock ADD COLUMN sale_epoch BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE stock DROP COLUMN sale_epoch;
