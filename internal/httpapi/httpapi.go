// Package httpapi is the HTTP adapter of the service (gin): it decodes and
// checks requests, calls the inventory service, and maps its errors to
// status codes through one table. gin's types stay inside this package.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/stock/internal/inventory"
)

func init() {
	// gin keeps its mode in a package variable and prints its route table
	// in debug mode; set it once, before any server exists.
	gin.SetMode(gin.ReleaseMode)
}

// MaxBodyBytes bounds a request body; a larger one is refused with 400.
const MaxBodyBytes = 64 << 10

// Inventory is what the handlers need from the domain.
type Inventory interface {
	PlaceOrder(ctx context.Context, req inventory.Request) (inventory.Order, error)
	FindOrder(ctx context.Context, id, userID string) (inventory.Order, error)
	ListOrders(ctx context.Context, userID, sku, after string, limit int) (inventory.OrderPage, error)
	PayOrder(ctx context.Context, id, userID string) (inventory.Order, error)
	CancelOrder(ctx context.Context, id, userID string) (inventory.Order, error)
	RestockSale(ctx context.Context, req inventory.RestockRequest) (inventory.Restocked, error)
	Level(ctx context.Context, sku string) (inventory.Level, error)
	OpenSale(ctx context.Context, req inventory.SaleRequest) (inventory.SaleStarted, error)
	OpenCatalog(ctx context.Context, req inventory.CatalogRequest) (inventory.CatalogStarted, error)
	Audit(ctx context.Context, sku string) (inventory.Audit, error)
	Ready(ctx context.Context) error
}

// Option configures New.
type Option func(*server)

// WithAdminToken sets the bearer token of the /admin routes. Default "":
// the admin routes answer 403 to everyone.
func WithAdminToken(token string) Option {
	return func(s *server) { s.adminToken = token }
}

// WithLogger sets the logger. Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(s *server) { s.log = l }
}

// WithReadyTimeout bounds the backend checks of /readyz. Default 2s.
func WithReadyTimeout(d time.Duration) Option {
	return func(s *server) { s.readyTimeout = d }
}

// WithMetrics serves h at GET /metrics. Default: no /metrics route.
func WithMetrics(h http.Handler) Option {
	return func(s *server) { s.metrics = h }
}

// WithOverCap sets how a request tells that its connection was accepted
// over the instance's connection cap (connlimit.OverCap). Such a request is
// served only on the operator routes, /healthz, /readyz and /metrics: the
// operator must still see the instance when a flood of connections holds
// it. Every other route answers 503 too_many_connections. Either way the
// answer closes the connection, to free its place in the headroom. Default:
// no request is over the cap.
func WithOverCap(overCap func(context.Context) bool) Option {
	return func(s *server) { s.overCap = overCap }
}

type server struct {
	metrics      http.Handler
	overCap      func(context.Context) bool
	inv          Inventory
	adminToken   string
	log          *slog.Logger
	readyTimeout time.Duration
}

// New returns the service's HTTP handler.
func New(inv Inventory, opts ...Option) http.Handler {
	s := &server{inv: inv, log: slog.Default(), readyTimeout: 2 * time.Second}
	for _, o := range opts {
		o(s)
	}
	r := gin.New()
	// Every answer of the router is JSON in the error shape of the API: no
	// redirect of /orders/ to /orders (gin's default answers a 307 with a
	// non-JSON body, and a client that follows it posts twice), no guessing
	// of a path in another case, and a 405 with Allow for a wrong method.
	r.RedirectTrailingSlash = false
	r.RedirectFixedPath = false
	r.HandleMethodNotAllowed = true
	r.Use(gin.CustomRecovery(func(c *gin.Context, v any) {
		s.log.Error("panic in handler", "path", c.Request.URL.Path, "panic", fmt.Sprint(v))
		writeError(c, http.StatusInternalServerError, "internal", "internal error")
	}))
	r.NoRoute(func(c *gin.Context) {
		writeError(c, http.StatusNotFound, "not_found", "no such route: "+c.Request.Method+" "+c.Request.URL.Path)
	})
	r.NoMethod(func(c *gin.Context) {
		writeError(c, http.StatusMethodNotAllowed, "method_not_allowed", c.Request.Method+" is not allowed on "+c.Request.URL.Path)
	})
	if s.overCap != nil {
		// Before the routes: gin runs the middleware in use when a route
		// is added.
		r.Use(s.operatorOnlyOverCap)
	}

	r.POST("/orders", s.placeOrder)
	r.GET("/orders", s.listOrders)
	r.GET("/orders/:id", s.getOrder)
	r.POST("/orders/:id/pay", s.payOrder)
	r.POST("/orders/:id/cancel", s.cancelOrder)
	r.GET("/stock/:sku", s.getStock)
	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.GET("/readyz", s.ready)
	if s.metrics != nil {
		r.GET("/metrics", gin.WrapH(s.metrics))
	}
	admin := r.Group("/admin", s.requireAdmin)
	admin.PUT("/stock", s.startCatalog)
	admin.PUT("/stock/:sku", s.startSale)
	admin.POST("/stock/:sku/restock", s.restock)
	admin.GET("/audit/:sku", s.audit)
	return r
}

// errorStatus is the one table from domain errors to HTTP answers. The first
// row that matches wins, so a busy answer that also wraps a backend error
// stays "busy".
var errorStatus = []struct {
	err     error
	status  int
	code    string
	message string // when set, replaces the error text, which may hold backend details
}{
	{errUnsupportedMediaType, http.StatusUnsupportedMediaType, "unsupported_media_type", ""},
	{errTooManyConnections, http.StatusServiceUnavailable, "too_many_connections", "the instance holds as many connections as it may; nothing was done, retry later"},
	{inventory.ErrInvalid, http.StatusBadRequest, "invalid_request", ""},
	{inventory.ErrUnknownSKU, http.StatusNotFound, "unknown_sku", ""},
	{inventory.ErrOrderNotFound, http.StatusNotFound, "order_not_found", ""},
	{inventory.ErrSoldOut, http.StatusConflict, "sold_out", ""},
	{inventory.ErrLimitReached, http.StatusConflict, "limit_reached", ""},
	{inventory.ErrSaleNotStarted, http.StatusConflict, "not_started", ""},
	{inventory.ErrSaleEnded, http.StatusConflict, "ended", ""},
	{inventory.ErrOrderPaid, http.StatusConflict, "paid", ""},
	{inventory.ErrOrderCancelled, http.StatusConflict, "cancelled", ""},
	{inventory.ErrOrderExpired, http.StatusConflict, "expired", ""},
	{inventory.ErrOrderFinal, http.StatusConflict, "final", ""},
	{inventory.ErrIdempotencyConflict, http.StatusUnprocessableEntity, "idempotency_conflict", ""},
	// The 503s: their message says what the answer means for the route
	// (meanings), above all whether the write may have happened.
	{inventory.ErrBusy, http.StatusServiceUnavailable, "busy", ""},
	{inventory.ErrConflict, http.StatusServiceUnavailable, "busy", ""},
	{inventory.ErrOutcomeUnknown, http.StatusServiceUnavailable, "unavailable", ""},
	{inventory.ErrUnavailable, http.StatusServiceUnavailable, "unavailable", ""},
}

// retryAfterSeconds is what 503 answers ask a client to wait.
const retryAfterSeconds = "1"

func (s *server) fail(c *gin.Context, err error) {
	for _, row := range errorStatus {
		if errors.Is(err, row.err) {
			msg := row.message
			if row.status == http.StatusServiceUnavailable && msg == "" {
				msg = meaningOf(c.FullPath()).of(err)
			}
			if msg == "" {
				msg = err.Error()
			}
			writeError(c, row.status, row.code, msg)
			return
		}
	}
	// An error no row knows is a backend's the adapters did not file (a
	// constraint, a driver's): a 503 that says what it means for the
	// route, never a 500. Every such error comes before a commit (a
	// commit's are filed as unknown), so nothing was written.
	s.log.Error("unexpected error", "path", c.Request.URL.Path, "err", err)
	writeError(c, http.StatusServiceUnavailable, "unavailable", meaningOf(c.FullPath()).unavailable)
}

func writeError(c *gin.Context, status int, code, message string) {
	if status == http.StatusServiceUnavailable {
		c.Header("Retry-After", retryAfterSeconds)
	}
	c.Abort()
	c.Data(status, jsonContentType, appendErrorJSON(make([]byte, 0, 128), code, message))
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{inventory.ErrInvalid}, args...)...)
}

// errUnsupportedMediaType and errTooManyConnections are the HTTP adapter's
// own: the domain never sees them.
var (
	errUnsupportedMediaType = errors.New("body must be application/json")
	errTooManyConnections   = errors.New("too many connections")
)

// operatorRoutes are served on a connection over the cap (WithOverCap).
var operatorRoutes = []string{"/healthz", "/readyz", "/metrics"}

// operatorOnlyOverCap lets a request over the connection cap through to
// the operator routes only.
func (s *server) operatorOnlyOverCap(c *gin.Context) {
	if !s.overCap(c.Request.Context()) {
		return
	}
	c.Header("Connection", "close")
	// FullPath is the matched route: "" for no route, so a path that
	// merely looks like a probe's is refused too.
	if slices.Contains(operatorRoutes, c.FullPath()) {
		return
	}
	s.fail(c, errTooManyConnections)
}

type orderRequest struct {
	SKU      *string         `json:"sku"`
	Quantity json.RawMessage `json:"quantity"`
	UserID   *string         `json:"user_id"`
}

// orderResponse is an order as the API shows it: a new order's 201, and
// GET, pay and cancel (which add expires_at once the database has set it).
type orderResponse struct {
	OrderID  string `json:"order_id"`
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
	UserID   string `json:"user_id"`
	Strategy string `json:"strategy"`
	// State is "final" (HOLD_TTL=0) or "held", "paid", "cancelled",
	// "expired".
	State     string     `json:"state"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

func orderJSON(o inventory.Order) orderResponse {
	r := orderResponse{OrderID: o.ID, SKU: o.SKU, Quantity: o.Quantity, UserID: o.UserID, Strategy: o.Strategy, State: o.State}
	if !o.ExpiresAt.IsZero() {
		r.ExpiresAt = &o.ExpiresAt
	}
	return r
}

func (s *server) placeOrder(c *gin.Context) {
	req, err := decodeOrder(c)
	if err != nil {
		s.fail(c, err)
		return
	}
	order, err := s.inv.PlaceOrder(c.Request.Context(), req)
	if err != nil {
		s.fail(c, err)
		return
	}
	writeOrder(c, http.StatusCreated, orderJSON(order))
}

func decodeOrder(c *gin.Context) (inventory.Request, error) {
	raw, err := readBody(c)
	if err != nil {
		return inventory.Request{}, err
	}
	var body orderRequest
	if !decodeOrderBody(raw, &body) {
		body = orderRequest{}
		if err := decodeJSON(raw, &body); err != nil {
			return inventory.Request{}, err
		}
	}
	var missing []string
	if body.SKU == nil {
		missing = append(missing, "sku")
	}
	if len(body.Quantity) == 0 {
		missing = append(missing, "quantity")
	}
	if body.UserID == nil {
		missing = append(missing, "user_id")
	}
	if len(missing) > 0 {
		return inventory.Request{}, invalid("missing field(s): %s", strings.Join(missing, ", "))
	}
	q, err := integer(body.Quantity, "quantity")
	if err != nil {
		return inventory.Request{}, err
	}
	req := inventory.Request{SKU: *body.SKU, Quantity: q, UserID: *body.UserID, IdempotencyKey: c.GetHeader("Idempotency-Key")}
	// Validate here too, so that a bad request never reaches the service's
	// deadline or the database.
	return req, req.Validate()
}

type stockResponse struct {
	SKU       string `json:"sku"`
	Available int64  `json:"available"`
}

func (s *server) getStock(c *gin.Context) {
	sku := c.Param("sku")
	level, err := s.inv.Level(c.Request.Context(), sku)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, stockResponse{SKU: sku, Available: level.Available})
}

func (s *server) ready(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), s.readyTimeout)
	defer cancel()
	if err := s.inv.Ready(ctx); err != nil {
		// The error names hosts, users and databases: it goes to the log,
		// and the probe, which anyone who reaches the port may call, gets
		// the code only.
		s.log.Warn("not ready", "err", err)
		writeError(c, http.StatusServiceUnavailable, "unavailable", "a backend does not answer; the service log says which")
		return
	}
	c.JSON(http.StatusOK, gin.H{"status": "ready"})
}

// meaning is what a 503 of one route tells its client, by the error: busy
// (the write ran out of time or lost to conflicts), unavailable (a backend
// failed), unknown (a commit's answer was lost and could not be resolved).
// Each says whether the write may have happened, and how to retry safely.
type meaning struct {
	busy, unavailable, unknown string
}

func (m meaning) of(err error) string {
	switch {
	case errors.Is(err, inventory.ErrOutcomeUnknown):
		return m.unknown
	case errors.Is(err, inventory.ErrBusy), errors.Is(err, inventory.ErrConflict):
		return m.busy
	}
	return m.unavailable
}

// meanings are the 503s of each route, by its gin path (c.FullPath); a
// route not listed reads and changes nothing.
var meanings = map[string]meaning{
	"/orders": {
		busy:        "the order was not taken in time: nothing was deducted; retry (with the same Idempotency-Key, a retry never takes a second order)",
		unavailable: "a backend is unavailable: the order was not taken, nothing was deducted; retry later",
		unknown:     "the order may have been taken: its store stopped answering while committing and could not be asked since, or took it but its replicas did not confirm it in time; retry with the same Idempotency-Key to get it, or look for it with GET /orders?user_id=… before ordering again",
	},
	"/orders/:id/pay":    settleMeaning,
	"/orders/:id/cancel": settleMeaning,
	"/admin/stock/:sku": {
		busy:        "the sale's start did not complete in time: it may have been recorded in part; retry with the same Idempotency-Key (a retry completes a start half done and never starts the sale twice); without a key, a retry starts the sale anew",
		unavailable: "a backend is unavailable: the sale's start may have been recorded in part; retry with the same Idempotency-Key (a retry completes it and never starts the sale twice); without a key, a retry starts the sale anew",
		unknown:     "the database stopped answering while committing: the sale may have started; retry with the same Idempotency-Key (never started twice); without a key, a retry starts the sale anew",
	},
	"/admin/stock": {
		busy:        "the catalog's start did not complete in time: its SKUs' sales may have started in the database and not yet everywhere else; retry with the same Idempotency-Key (a retry completes them and never starts a sale twice); without a key, a retry starts every sale anew",
		unavailable: "a backend is unavailable: the catalog's sales may have started in the database and not yet everywhere else; retry with the same Idempotency-Key (a retry completes them and never starts a sale twice); without a key, a retry starts every sale anew",
		unknown:     "the database stopped answering while committing: every sale of the catalog may have started, or none; retry with the same Idempotency-Key (never started twice); without a key, a retry starts every sale anew",
	},
	"/admin/stock/:sku/restock": {
		busy:        "the restock was not applied in time: nothing was added; retry (with the same Idempotency-Key, the units are added once in all)",
		unavailable: "a backend is unavailable: nothing was added by this request; retry (with the same Idempotency-Key, the units are added once in all)",
		unknown:     "the database stopped answering while committing and could not be asked since: the restock may have been applied; retry with the same Idempotency-Key (added once in all), or find it in GET /admin/audit/{sku}'s restocks before a retry without one",
	},
}

var settleMeaning = meaning{
	busy:        "the order was not changed in time; retry: pay and cancel are idempotent",
	unavailable: "a backend is unavailable: the order was not changed; retry later (pay and cancel are idempotent)",
	unknown:     "the database stopped answering while committing: the order may have changed; retry as it was to learn its fate (pay and cancel are idempotent)",
}

// readMeaning is the 503 of the routes that only read.
var readMeaning = meaning{
	busy:        "the answer could not be read in time: nothing was changed; retry",
	unavailable: "a backend is unavailable: nothing was changed; retry later",
	unknown:     "a backend stopped answering; retry later",
}

func meaningOf(route string) meaning {
	if m, ok := meanings[route]; ok {
		return m
	}
	return readMeaning
}
