package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/stock/internal/inventory"
)

// The routes of an order after it was placed: its buyer reads it, pays it
// or cancels it. Each names the buyer (user_id), and an order of another
// buyer answers 404 as an unknown id does, so that a buyer never learns
// that someone else's order exists.

// getOrder answers GET /orders/{id}?user_id=U. A held order whose hold has
// lapsed is answered expired (and its units go back at once).
func (s *server) getOrder(c *gin.Context) {
	userID, ok := c.GetQuery("user_id")
	if !ok {
		s.fail(c, fmt.Errorf("%w: missing query parameter user_id", inventory.ErrInvalid))
		return
	}
	order, err := s.inv.FindOrder(c.Request.Context(), c.Param("id"), userID)
	if err != nil {
		s.fail(c, err)
		return
	}
	writeOrder(c, http.StatusOK, orderJSON(order))
}

// orderListResponse is a page of a buyer's orders; next_after, when
// present, asks for the next page (?after=).
type orderListResponse struct {
	Orders    []orderResponse `json:"orders"`
	NextAfter string          `json:"next_after,omitempty"`
}

// listOrders answers GET /orders?user_id=U[&sku=S][&after=ID][&limit=N]:
// the buyer's orders, oldest first, at most limit (default and most 100)
// a page. A client that sent no Idempotency-Key finds here what a lost
// answer or a 503 left: every order the database has, whatever its buyer
// was told.
func (s *server) listOrders(c *gin.Context) {
	userID, ok := c.GetQuery("user_id")
	if !ok {
		s.fail(c, fmt.Errorf("%w: missing query parameter user_id", inventory.ErrInvalid))
		return
	}
	limit := 0
	if raw, ok := c.GetQuery("limit"); ok {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > inventory.MaxListedOrders {
			s.fail(c, fmt.Errorf("%w: limit must be an integer from 1 to %d", inventory.ErrInvalid, inventory.MaxListedOrders))
			return
		}
		limit = n
	}
	sku, hasSKU := c.GetQuery("sku")
	if hasSKU && sku == "" {
		s.fail(c, fmt.Errorf("%w: sku must not be empty", inventory.ErrInvalid))
		return
	}
	page, err := s.inv.ListOrders(c.Request.Context(), userID, sku, c.Query("after"), limit)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := orderListResponse{Orders: make([]orderResponse, len(page.Orders)), NextAfter: page.Next}
	for i, o := range page.Orders {
		out.Orders[i] = orderJSON(o)
	}
	c.JSON(http.StatusOK, out)
}

// settleRequest is the body of pay and cancel.
type settleRequest struct {
	UserID *string `json:"user_id"`
}

// payOrder answers POST /orders/{id}/pay {"user_id": "U"}: 200 with the
// paid order (again for a repeat), 409 expired, cancelled or final.
func (s *server) payOrder(c *gin.Context) {
	s.settle(c, s.inv.PayOrder)
}

// cancelOrder answers POST /orders/{id}/cancel {"user_id": "U"}: 200 with
// the cancelled order (again for a repeat), 409 paid, expired or final.
func (s *server) cancelOrder(c *gin.Context) {
	s.settle(c, s.inv.CancelOrder)
}

func (s *server) settle(c *gin.Context, move func(ctx context.Context, id, userID string) (inventory.Order, error)) {
	var body settleRequest
	if err := readJSON(c, &body); err != nil {
		s.fail(c, err)
		return
	}
	if body.UserID == nil {
		s.fail(c, fmt.Errorf("%w: missing field(s): user_id", inventory.ErrInvalid))
		return
	}
	order, err := move(c.Request.Context(), c.Param("id"), *body.UserID)
	if err != nil {
		s.fail(c, err)
		return
	}
	writeOrder(c, http.StatusOK, orderJSON(order))
}
