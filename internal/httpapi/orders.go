package httpapi

import (
	"context"
	"fmt"
	"net/http"

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
