package httpapi

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/stock/internal/inventory"
)

// requireAdmin lets a request through only with the admin bearer token.
func (s *server) requireAdmin(c *gin.Context) {
	if s.adminToken == "" {
		writeError(c, http.StatusForbidden, "forbidden", "the admin API is disabled: start the service with ADMIN_TOKEN set")
		return
	}
	token, ok := strings.CutPrefix(c.GetHeader("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(token), []byte(s.adminToken)) != 1 {
		c.Header("WWW-Authenticate", `Bearer realm="stock admin"`)
		writeError(c, http.StatusUnauthorized, "unauthorized", "a valid admin bearer token is required")
		return
	}
	c.Next()
}

type startSaleRequest struct {
	Available json.RawMessage `json:"available"`
	// StartsAt and EndsAt bound the sale's window (RFC 3339); absent: no
	// bound.
	StartsAt *time.Time `json:"starts_at"`
	EndsAt   *time.Time `json:"ends_at"`
}

type startSaleResponse struct {
	SKU       string     `json:"sku"`
	Available int64      `json:"available"`
	StartsAt  *time.Time `json:"starts_at,omitempty"`
	EndsAt    *time.Time `json:"ends_at,omitempty"`
	// Replayed: a retry's answer (the same Idempotency-Key and body);
	// nothing was started again.
	Replayed bool `json:"replayed,omitempty"`
}

func (s *server) startSale(c *gin.Context) {
	sku := c.Param("sku")
	var body startSaleRequest
	if err := readJSON(c, &body); err != nil {
		s.fail(c, err)
		return
	}
	n, err := integer(body.Available, "available")
	if err != nil {
		s.fail(c, err)
		return
	}
	w, err := saleWindow(body.StartsAt, body.EndsAt)
	if err != nil {
		s.fail(c, err)
		return
	}
	started, err := s.inv.OpenSale(c.Request.Context(), inventory.SaleRequest{SKU: sku, Available: n, Window: w, IdempotencyKey: c.GetHeader("Idempotency-Key")})
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, startSaleResponse{SKU: sku, Available: n, StartsAt: body.StartsAt, EndsAt: body.EndsAt, Replayed: started.Replayed})
}

type restockRequest struct {
	Quantity json.RawMessage `json:"quantity"`
}

// restockResponse is a restock's answer: the SKU's stock after it, and the
// restock (its id, as the audit lists it).
type restockResponse struct {
	SKU       string `json:"sku"`
	Available int64  `json:"available"`
	RestockID string `json:"restock_id"`
	Quantity  int64  `json:"quantity"`
	// Replayed: a retry's answer (the same Idempotency-Key and body);
	// nothing was added, and available is the stock now.
	Replayed bool `json:"replayed,omitempty"`
}

// restock answers POST /admin/stock/{sku}/restock {"quantity": n}: n more
// units for the current sale, its orders kept; 404 unknown_sku when no sale
// was started. With an Idempotency-Key a retry adds nothing.
func (s *server) restock(c *gin.Context) {
	sku := c.Param("sku")
	var body restockRequest
	if err := readJSON(c, &body); err != nil {
		s.fail(c, err)
		return
	}
	n, err := integer(body.Quantity, "quantity")
	if err != nil {
		s.fail(c, err)
		return
	}
	r, err := s.inv.RestockSale(c.Request.Context(), inventory.RestockRequest{SKU: sku, Quantity: n, IdempotencyKey: c.GetHeader("Idempotency-Key")})
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, restockResponse{SKU: sku, Available: r.Level.Available, RestockID: r.Restock.ID, Quantity: r.Restock.Quantity, Replayed: r.Replayed})
}

type auditResponse struct {
	SKU        string `json:"sku"`
	Initial    int64  `json:"initial"`
	Restocked  int64  `json:"restocked"`
	Available  int64  `json:"available"`
	Ordered    int64  `json:"ordered"`
	Orders     int64  `json:"orders"`
	Consistent bool   `json:"consistent"`
	// The lifecycle (HOLD_TTL): ordered = held + paid (a final order counts
	// as paid); returned is what cancelled and expired orders gave back.
	Held      int64 `json:"held"`
	Paid      int64 `json:"paid"`
	Returned  int64 `json:"returned"`
	Cancelled int64 `json:"cancelled"`
	Expired   int64 `json:"expired"`
	// Pending counts accepted orders not yet in the database, LagSeconds
	// the age of the oldest (redis-reserve; 0 for the others). Drift says
	// how the database disagrees with where the stock is counted.
	Pending    int64   `json:"pending"`
	LagSeconds float64 `json:"lag_seconds"`
	// Relaying is the units returned in the database and not yet given
	// back to Redis (the reservation strategies' relay; 0 for the others).
	Relaying int64  `json:"relaying"`
	Drift    string `json:"drift,omitempty"`
	// Restocks lists the sale's restocks (the newest 100), each with its
	// Idempotency-Key: a restock applied twice would show.
	Restocks []restockJSON `json:"restocks"`
}

type restockJSON struct {
	RestockID      string    `json:"restock_id"`
	Quantity       int64     `json:"quantity"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	At             time.Time `json:"at"`
}

func (s *server) audit(c *gin.Context) {
	a, err := s.inv.Audit(c.Request.Context(), c.Param("sku"))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, auditResponse{
		SKU: a.SKU, Initial: a.Initial, Restocked: a.Restocked, Available: a.Available, Ordered: a.Ordered, Orders: a.Orders, Consistent: a.Consistent(),
		Held: a.Held, Paid: a.Paid, Returned: a.Returned, Cancelled: a.Cancelled, Expired: a.Expired,
		Pending: a.Pending, LagSeconds: a.Lag.Seconds(), Relaying: a.Relaying, Drift: a.Drift,
		Restocks: restocksJSON(a.Restocks),
	})
}

func restocksJSON(rs []inventory.Restock) []restockJSON {
	out := make([]restockJSON, len(rs))
	for i, r := range rs {
		out[i] = restockJSON{RestockID: r.ID, Quantity: r.Quantity, IdempotencyKey: r.Key, At: r.At}
	}
	return out
}
