package sales

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/inventory"
)

// FindOrder returns the order id of buyer userID: ErrInvalid for a
// malformed id or user, ErrOrderNotFound when there is no such order or it
// is another buyer's. A held order whose hold has lapsed is expired on the
// spot (its units go back) and answered expired. An order of the reservation strategies is found once
// the stream has written it to the database (usually within milliseconds
// of its 201).
func (s *Service) FindOrder(ctx context.Context, id, userID string) (inventory.Order, error) {
	id, err := canonicalOrderID(id)
	if err != nil {
		return inventory.Order{}, err
	}
	if err := inventory.ValidateUserID(userID); err != nil {
		return inventory.Order{}, err
	}
	// Bounded like an order: a read that waits behind a row lock (the
	// lazy expiry's) gives up and answers busy.
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	o, found, err := s.store.FindOrder(ctx, id)
	if err == nil && !found && s.relay != nil {
		o, found, err = s.awaitWritten(ctx, id)
	}
	if err != nil {
		return inventory.Order{}, s.classify(ctx, err)
	}
	if !found || o.UserID != userID {
		return inventory.Order{}, fmt.Errorf("%w: %s", inventory.ErrOrderNotFound, id)
	}
	return s.expireIfLapsed(ctx, o)
}

// awaitWritten looks for order id again for up to a second (within ctx),
// when the strategy counts the stock outside the database: its orders are
// answered 201 before its stream writes them here, usually milliseconds
// later, and a buyer who pays at once must find the order. An unknown id
// costs that second, at a few lookups. Only lookups that answered make it
// unknown (404): a lookup that failed, or that the second cut short, is
// the database's failure, answered as such (503), not as an absent order.
func (s *Service) awaitWritten(ctx context.Context, id string) (inventory.Order, bool, error) {
	wait, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for attempt := 0; ; attempt++ {
		if inventory.Pause(wait, backoff.Exponential(attempt, 2*time.Millisecond, 100*time.Millisecond)) != nil {
			return inventory.Order{}, false, nil
		}
		o, found, err := s.store.FindOrder(wait, id)
		if err != nil || found {
			return o, found, err
		}
	}
}

// canonicalOrderID accepts an order id as the service writes it, a UUID in
// its 36-character form, and returns it in lower case, as the service
// writes it: PostgreSQL's uuid column matches either case, MariaDB's
// CHAR(36) of a binary collation only the one stored, and an id must find
// the same order on both. uuid.Parse alone also takes "urn:uuid:…" and
// braced spellings, which one engine would refuse as a malformed value (a
// 500) and another answer as unknown.
func canonicalOrderID(id string) (string, error) {
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 || u.String() != strings.ToLower(id) {
		return "", fmt.Errorf("%w: order id %q is not a UUID (36 characters, as the order's answer gave it)", inventory.ErrInvalid, id)
	}
	return u.String(), nil
}

// ListOrders lists the orders of buyer userID, of sku only when it is not
// "", oldest first, a page of at most limit (1..MaxListedOrders; 0 for
// the most) after order id after ("" for the first page). It is how a
// buyer without an idempotency key finds what an answer lost or a 503 left
// behind: an order the database has is listed, whatever its buyer was
// told. A held order whose hold has lapsed is expired on the spot, as
// FindOrder does. An order of the reservation strategies is listed once
// the stream has written it (usually within milliseconds of its 201).
func (s *Service) ListOrders(ctx context.Context, userID, sku, after string, limit int) (inventory.OrderPage, error) {
	if err := inventory.ValidateUserID(userID); err != nil {
		return inventory.OrderPage{}, err
	}
	if sku != "" {
		if err := inventory.ValidateSKU(sku); err != nil {
			return inventory.OrderPage{}, err
		}
	}
	if after != "" {
		var err error
		if after, err = canonicalOrderID(after); err != nil {
			return inventory.OrderPage{}, err
		}
	}
	if limit == 0 {
		limit = inventory.MaxListedOrders
	}
	if limit < 1 || limit > inventory.MaxListedOrders {
		return inventory.OrderPage{}, fmt.Errorf("%w: limit must be an integer from 1 to %d", inventory.ErrInvalid, inventory.MaxListedOrders)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// One more than the page: whether there is a next one.
	orders, err := s.store.ListOrders(ctx, userID, sku, after, limit+1)
	if err != nil {
		return inventory.OrderPage{}, s.classify(ctx, err)
	}
	var page inventory.OrderPage
	if len(orders) > limit {
		orders = orders[:limit]
		page.Next = orders[limit-1].ID
	}
	for i, o := range orders {
		if orders[i], err = s.expireIfLapsed(ctx, o); err != nil {
			return inventory.OrderPage{}, err
		}
	}
	page.Orders = orders
	return page, nil
}
