package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/stock/internal/inventory"
)

// MaxCatalogBodyBytes bounds the body of PUT /admin/stock: 10,000 rows
// (inventory.MaxCatalogSKUs) of a 64-character SKU and both bounds of a
// window fit in about 2 MiB.
const MaxCatalogBodyBytes = 4 << 20

// catalogRow is one row of PUT /admin/stock's array: a SKU's sale, as
// PUT /admin/stock/{sku} takes it.
type catalogRow struct {
	SKU       *string         `json:"sku"`
	Available json.RawMessage `json:"available"`
	StartsAt  *time.Time      `json:"starts_at"`
	EndsAt    *time.Time      `json:"ends_at"`
}

type catalogResponse struct {
	// SKUs is how many SKUs were put on sale.
	SKUs int `json:"skus"`
	// Replayed: a retry's answer (the same Idempotency-Key and rows);
	// nothing was started again.
	Replayed bool `json:"replayed,omitempty"`
}

// startCatalog answers PUT /admin/stock [{"sku": …, "available": n,
// "starts_at": …, "ends_at": …}, …]: every SKU of the array put on sale
// as PUT /admin/stock/{sku} puts one, in one transaction. A bad row is a
// 400 that names it (its index from 0 and its SKU), and nothing is
// started.
func (s *server) startCatalog(c *gin.Context) {
	body, err := readBodyUpTo(c, MaxCatalogBodyBytes)
	if err != nil {
		s.fail(c, err)
		return
	}
	req, err := decodeCatalog(body)
	if err != nil {
		s.fail(c, err)
		return
	}
	req.IdempotencyKey = c.GetHeader("Idempotency-Key")
	started, err := s.inv.OpenCatalog(c.Request.Context(), req)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, catalogResponse{SKUs: started.SKUs, Replayed: started.Replayed})
}

// decodeCatalog reads the array of rows, each as readJSON reads an
// object: unknown, repeated or look-alike fields refused, naming the row.
func decodeCatalog(body []byte) (inventory.CatalogRequest, error) {
	var raw []json.RawMessage
	if trimmed := bytes.TrimSpace(body); len(trimmed) == 0 || trimmed[0] != '[' {
		return inventory.CatalogRequest{}, invalid("the body must be a JSON array of sales, [{\"sku\": …, \"available\": …}, …]")
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return inventory.CatalogRequest{}, invalid("malformed JSON: %v", describeJSONError(err))
	}
	if len(raw) > inventory.MaxCatalogSKUs {
		return inventory.CatalogRequest{}, invalid("the body lists %d SKUs, more than %d: split it", len(raw), inventory.MaxCatalogSKUs)
	}
	req := inventory.CatalogRequest{Sales: make([]inventory.SaleRequest, len(raw))}
	for i, r := range raw {
		var row catalogRow
		if err := decodeJSON(r, &row); err != nil {
			return inventory.CatalogRequest{}, invalid("row %d: %v", i, trimInvalid(err))
		}
		if row.SKU == nil {
			return inventory.CatalogRequest{}, invalid("row %d: sku is required", i)
		}
		n, err := integer(row.Available, "available")
		if err != nil {
			return inventory.CatalogRequest{}, invalid("row %d (sku %q): %v", i, *row.SKU, trimInvalid(err))
		}
		w, err := saleWindow(row.StartsAt, row.EndsAt)
		if err != nil {
			return inventory.CatalogRequest{}, invalid("row %d (sku %q): %v", i, *row.SKU, trimInvalid(err))
		}
		req.Sales[i] = inventory.SaleRequest{SKU: *row.SKU, Available: n, Window: w}
	}
	return req, nil
}

// trimInvalid is err's text without ErrInvalid's, for a message that
// names the row first.
func trimInvalid(err error) string {
	return strings.TrimPrefix(err.Error(), inventory.ErrInvalid.Error()+": ")
}

// saleWindow is a sale's window from the bounds a body gave, in UTC; nil
// is no bound. A bound at Go's zero time (0001-01-01T00:00:00Z) is
// refused: the domain reads it as no bound, and a sale meant to end then
// would never end.
func saleWindow(startsAt, endsAt *time.Time) (inventory.SaleWindow, error) {
	var w inventory.SaleWindow
	for _, b := range []struct {
		name string
		in   *time.Time
		out  *time.Time
	}{{"starts_at", startsAt, &w.StartsAt}, {"ends_at", endsAt, &w.EndsAt}} {
		if b.in == nil {
			continue
		}
		if b.in.IsZero() {
			return w, invalid("%s must be after 0001-01-01T00:00:00Z (leave it out for no bound)", b.name)
		}
		*b.out = b.in.UTC()
	}
	return w, nil
}
