package inventory

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"
)

// A catalog's sale: many SKUs put on sale in one request (PUT
// /admin/stock), each as a sale's start does for one, in one transaction:
// every SKU of the request starts, or none does.

// MaxCatalogSKUs bounds the SKUs of one catalog request: 10,000 SKUs of
// a sale start in well under a second, and a transaction that large holds
// every one of their rows until it commits.
const MaxCatalogSKUs = 10_000

// AdminCatalog is the action of a catalog start's Idempotency-Key: one
// record for the whole request.
const AdminCatalog = "catalog"

// CatalogRequest asks for a new sale of every SKU of Sales, as a
// SaleRequest does for one; their own IdempotencyKey is unused: the
// request's names them all.
type CatalogRequest struct {
	Sales          []SaleRequest
	IdempotencyKey string
}

// Validate reports the first row that breaks a rule, by its index in the
// request and its SKU, wrapped in ErrInvalid: one SKU twice, too many or
// none, a SaleRequest's rules.
func (r CatalogRequest) Validate() error {
	switch {
	case len(r.Sales) == 0:
		return fmt.Errorf("%w: the request names no SKU", ErrInvalid)
	case len(r.Sales) > MaxCatalogSKUs:
		return fmt.Errorf("%w: the request names %d SKUs, more than %d: split it", ErrInvalid, len(r.Sales), MaxCatalogSKUs)
	}
	seen := make(map[string]int, len(r.Sales))
	for i, s := range r.Sales {
		s.IdempotencyKey = ""
		if err := s.Validate(); err != nil {
			return fmt.Errorf("%w: row %d (sku %q): %s", ErrInvalid, i, s.SKU, strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
		}
		if first, dup := seen[s.SKU]; dup {
			return fmt.Errorf("%w: row %d (sku %q): the SKU is row %d already", ErrInvalid, i, s.SKU, first)
		}
		seen[s.SKU] = i
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

// Fingerprint identifies the content of the request, its rows in any
// order: a retry that lists them otherwise is the same request.
func (r CatalogRequest) Fingerprint() []byte {
	rows := make([][]byte, len(r.Sales))
	for i, s := range r.Sales {
		rows[i] = s.Fingerprint()
	}
	slices.SortFunc(rows, func(a, b []byte) int { return strings.Compare(string(a), string(b)) })
	h := sha256.New()
	h.Write([]byte(AdminCatalog))
	_ = binary.Write(h, binary.BigEndian, uint32(len(rows)))
	for _, row := range rows {
		h.Write(row)
	}
	return h.Sum(nil)
}

// Starts is the request's sales as the store starts them, in the order
// their rows are locked in: by SKU, byte order, which is the order both
// engines' SKU columns sort in (ASCII, binary collation), so two catalog
// starts that share SKUs queue instead of deadlocking.
func (r CatalogRequest) Starts() []SaleStart {
	starts := make([]SaleStart, len(r.Sales))
	for i, s := range r.Sales {
		starts[i] = SaleStart{SKU: s.SKU, Available: s.Available, Window: s.Window}
	}
	slices.SortFunc(starts, func(a, b SaleStart) int { return strings.Compare(a.SKU, b.SKU) })
	return starts
}

// CatalogStarted is the answer to a catalog's start; Replayed when it is
// a retry's answer (nothing was started again).
type CatalogStarted struct {
	SKUs     int
	Replayed bool
}

// CatalogStart is a catalog's start as the store runs it, in one
// transaction: each of Starts as StartSaleWith runs it (their Key and
// BeforeCommit unused), Key recorded once, then BeforeCommit with the
// sales' numbers, Sales[i] the number of Starts[i], every row locked.
type CatalogStart struct {
	// Starts, by SKU in byte order (CatalogRequest.Starts), each SKU once.
	Starts       []SaleStart
	Key          AdminRecord
	BeforeCommit func(ctx context.Context, sales []int64) error
}

// Finish is the end of every store's catalog transaction, once the rows
// hold the sales' numbers: Key recorded (ErrAdminKeyTaken when the key
// exists already), then BeforeCommit.
func (c CatalogStart) Finish(ctx context.Context, tx interface {
	InsertAdminKey(ctx context.Context, r AdminRecord) (bool, error)
}, sales []int64) error {
	if len(sales) != len(c.Starts) {
		return fmt.Errorf("catalog start: %d sale numbers for %d SKUs", len(sales), len(c.Starts))
	}
	if c.Key.Key != "" {
		inserted, err := tx.InsertAdminKey(ctx, c.Key)
		if err != nil {
			return err
		}
		if !inserted {
			return ErrAdminKeyTaken
		}
	}
	if c.BeforeCommit == nil {
		return nil
	}
	return c.BeforeCommit(ctx, sales)
}

// SaleRow is a SKU's sale as its stock row records it: its first units
// (restocks aside), its number and its window.
type SaleRow struct {
	SKU     string
	Initial int64
	Sale    int64
	Window  SaleWindow
}

// Describes reports whether the row is the sale st asks for (its units
// and its window, to the microsecond both engines keep).
func (r SaleRow) Describes(st SaleStart) bool {
	same := func(a, b time.Time) bool {
		if a.IsZero() || b.IsZero() {
			return a.IsZero() == b.IsZero()
		}
		d := a.Sub(b)
		return d > -time.Microsecond && d < time.Microsecond
	}
	return r.SKU == st.SKU && r.Initial == st.Available && same(r.Window.StartsAt, st.Window.StartsAt) && same(r.Window.EndsAt, st.Window.EndsAt)
}
