// Package inventory is the domain of the service: SKUs, orders, sales and
// their rules, the errors a caller can get, and the ports the rest is built
// on: the strategy contract (Strategy), the database (Store, Tx) and the
// observer. It holds no implementation of them.
//
// It knows nothing of HTTP or of a particular database. Each strategy
// family is a package beside it (internal/sqlrow, internal/batched,
// internal/locked, internal/reservation), internal/sales runs orders and
// sales through one, and each engine (internal/postgres, internal/mysql)
// implements the ports with its own SQL.
package inventory

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/flashsale/stock/internal/backoff"
)

// Errors a caller of this package can test with errors.Is. Adapters wrap them
// with %w so the cause stays readable.
var (
	// ErrVersionMoved: the stock row changed between a strategy's read
	// and its write (another order wrote it, or a newer lock holder did),
	// so the write was refused; the strategy reads again. A Deduct returns
	// it from inside the transaction it gives up, and the Service counts
	// it as a retry.
	ErrVersionMoved = errors.New("stock version moved")
	// ErrStaleSale: orders reserved outside the database (the reservation
	// strategies) in a sale of the SKU that has been restarted since; the
	// database refuses to write them into the new one.
	ErrStaleSale = errors.New("the orders belong to a sale that has been restarted")
	// ErrInvalid: the request breaks a rule of the domain; nothing changed.
	ErrInvalid = errors.New("invalid request")
	// ErrUnknownSKU: no sale has been started for the SKU.
	ErrUnknownSKU = errors.New("unknown sku")
	// ErrOrderNotFound: no order has that id, or it is another buyer's
	// (a buyer never learns that someone else's order exists).
	ErrOrderNotFound = errors.New("order not found")
	// ErrSoldOut: fewer units are available than asked for; nothing deducted.
	ErrSoldOut = errors.New("sold out")
	// ErrSaleNotStarted and ErrSaleEnded: the sale's window (starts_at,
	// ends_at) is not open on the database's clock; nothing changed.
	ErrSaleNotStarted = errors.New("the sale has not started")
	ErrSaleEnded      = errors.New("the sale has ended")
	// ErrLimitReached: the order would take the buyer past the per-user
	// limit of the SKU's sale (PER_USER_LIMIT); nothing changed.
	ErrLimitReached = errors.New("per-user limit reached")
	// ErrIdempotencyConflict: an Idempotency-Key was reused for another request.
	ErrIdempotencyConflict = errors.New("idempotency key reused with a different request")
	// ErrBusy: the deduction could not run in time (contention, a deadline,
	// retries exhausted). Nothing was deducted; the client may retry.
	ErrBusy = errors.New("busy")
	// ErrUnavailable: a backend could not be reached or failed.
	ErrUnavailable = errors.New("backend unavailable")
	// ErrConflict: the database aborted the transaction to resolve a
	// conflict (deadlock, serialisation failure, lock wait timeout). Nothing
	// was written, so the transaction may be run again.
	ErrConflict = errors.New("transaction aborted by a conflict")
	// ErrOutcomeUnknown: the commit was sent but its answer was lost, so the
	// order may or may not exist. It is never retried blindly; it also wraps
	// ErrUnavailable.
	ErrOutcomeUnknown = fmt.Errorf("%w: commit outcome unknown", ErrUnavailable)
	// ErrFencedOff: a lock holder's write was refused because a newer holder
	// of the lock had written the row: the lock was lost without the holder
	// knowing (a pause, a partition). Nothing was deducted; it wraps ErrBusy.
	ErrFencedOff = fmt.Errorf("%w: lock lost, a newer holder wrote first", ErrBusy)
)

// Limits of the domain, shared by the HTTP adapter and the tests.
const (
	// MaxAuditRestocks bounds the restocks an audit lists: the newest.
	MaxAuditRestocks = 100
	// MaxListedOrders bounds a page of a buyer's orders.
	MaxListedOrders = 100
	MaxSKULength    = 64
	MaxUserIDLength = 64
	MinQuantity     = 1
	MaxQuantity     = 1000
	MaxIdemKeyLen   = 255
	// MaxInitialStock bounds a sale so that sums of quantities stay far from
	// overflowing a BIGINT.
	MaxInitialStock = 1_000_000_000
)

// Request asks for Quantity units of SKU for UserID. IdempotencyKey, when set,
// makes retries of the same request return the first answer.
type Request struct {
	SKU            string
	Quantity       int64
	UserID         string
	IdempotencyKey string
}

// Validate reports the first rule the request breaks, wrapped in ErrInvalid.
func (r Request) Validate() error {
	if err := ValidateSKU(r.SKU); err != nil {
		return err
	}
	if r.Quantity < MinQuantity || r.Quantity > MaxQuantity {
		return fmt.Errorf("%w: quantity must be an integer from %d to %d", ErrInvalid, MinQuantity, MaxQuantity)
	}
	if err := ValidateUserID(r.UserID); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

// Fingerprint identifies the content of a request, so a reused idempotency
// key can be told apart from a retry. Lengths are written before strings so
// that no two different requests share a fingerprint.
func (r Request) Fingerprint() []byte {
	h := sha256.New()
	for _, s := range []string{r.SKU, r.UserID} {
		_ = binary.Write(h, binary.BigEndian, uint32(len(s)))
		h.Write([]byte(s))
	}
	_ = binary.Write(h, binary.BigEndian, r.Quantity)
	return h.Sum(nil)
}

// ValidateSKU checks a SKU: 1 to 64 characters from [A-Za-z0-9._:-].
func ValidateSKU(sku string) error {
	if sku == "" {
		return fmt.Errorf("%w: sku must not be empty", ErrInvalid)
	}
	if len(sku) > MaxSKULength {
		return fmt.Errorf("%w: sku must be at most %d characters", ErrInvalid, MaxSKULength)
	}
	for i := 0; i < len(sku); i++ {
		if !skuByte(sku[i]) {
			return fmt.Errorf("%w: sku may contain only letters, digits and . _ : -", ErrInvalid)
		}
	}
	return nil
}

func skuByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return c == '.' || c == '_' || c == ':' || c == '-'
}

// ValidateUserID checks a user id: 1 to 64 characters of valid UTF-8, each
// printable (a letter, mark, number, punctuation, symbol or the ASCII
// space), neither the first nor the last a space. Control characters (NUL, which PostgreSQL refuses in text, line
// breaks, escapes) and invisible format characters (bidi overrides, line
// separators) are refused: the id ends up in the database and in logs.
func ValidateUserID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: user_id must not be empty", ErrInvalid)
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("%w: user_id must be valid UTF-8", ErrInvalid)
	}
	if utf8.RuneCountInString(id) > MaxUserIDLength {
		return fmt.Errorf("%w: user_id must be at most %d characters", ErrInvalid, MaxUserIDLength)
	}
	for _, r := range id {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: user_id must not contain control or format characters (found %U)", ErrInvalid, r)
		}
	}
	// One buyer is one spelling on every engine and strategy. MariaDB's
	// collations pad with spaces ("alice" and "alice " are one key there),
	// PostgreSQL and Redis compare bytes (two buyers): refused, so that
	// no store ever sees the difference. The ASCII space is the only
	// space IsPrint lets through.
	if id[0] == ' ' || id[len(id)-1] == ' ' {
		return fmt.Errorf("%w: user_id must not begin or end with a space", ErrInvalid)
	}
	return nil
}

// ValidateIdempotencyKey accepts an empty key (none) or 1 to 255 printable
// ASCII characters.
func ValidateIdempotencyKey(key string) error {
	if len(key) > MaxIdemKeyLen {
		return fmt.Errorf("%w: Idempotency-Key must be at most %d characters", ErrInvalid, MaxIdemKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return fmt.Errorf("%w: Idempotency-Key must be printable ASCII without spaces", ErrInvalid)
		}
	}
	return nil
}

// ValidateInitialStock checks the stock a sale starts with.
func ValidateInitialStock(n int64) error {
	if n < 0 || n > MaxInitialStock {
		return fmt.Errorf("%w: available must be an integer from 0 to %d", ErrInvalid, MaxInitialStock)
	}
	return nil
}

// Level is a SKU's stock row as a strategy reads it.
type Level struct {
	Available int64
	// Version grows with every deduction (version-CAS compares it).
	Version int64
	// Fence is the highest lock fencing token that wrote the row.
	Fence int64
	// Window is where the database's clock stands against the sale's
	// window when the row was read.
	Window WindowState
}

// WindowState is where a sale stands against its window (starts_at,
// ends_at), on the database's clock.
type WindowState int

const (
	WindowOpen WindowState = iota
	WindowNotStarted
	WindowEnded
)

// SaleWindow bounds when a sale takes orders; a zero time is no bound.
type SaleWindow struct {
	StartsAt, EndsAt time.Time
}

// Validate refuses a window that ends before it starts.
func (w SaleWindow) Validate() error {
	// Years 1 to 9999 in UTC: what both engines store (MariaDB's driver
	// refuses a DATETIME outside them, which answered 503 for a bad
	// request, found by review).
	for _, b := range []struct {
		name string
		t    time.Time
	}{{"starts_at", w.StartsAt}, {"ends_at", w.EndsAt}} {
		if y := b.t.UTC().Year(); !b.t.IsZero() && (y < 1 || y > 9999) {
			return fmt.Errorf("%w: %s must be in the years 1 to 9999 UTC", ErrInvalid, b.name)
		}
	}
	if !w.StartsAt.IsZero() && !w.EndsAt.IsZero() && !w.EndsAt.After(w.StartsAt) {
		return fmt.Errorf("%w: ends_at (%s) must be after starts_at (%s)", ErrInvalid, w.EndsAt.Format(time.RFC3339), w.StartsAt.Format(time.RFC3339))
	}
	return nil
}

// Refusal says why the row, as read, cannot take quantity: the window
// (ErrSaleNotStarted, ErrSaleEnded), or too little stock (ErrSoldOut); nil
// when it can. Every strategy that reads before it writes decides with it.
func (l Level) Refusal(quantity int64) error {
	switch {
	case l.Window == WindowNotStarted:
		return ErrSaleNotStarted
	case l.Window == WindowEnded:
		return ErrSaleEnded
	case l.Available < quantity:
		return ErrSoldOut
	}
	return nil
}

// Audit is the bookkeeping of one SKU's sale.
type Audit struct {
	SKU     string
	Initial int64
	// Restocked is what restocks added to the sale since it started;
	// Restocks lists them (the newest MaxAuditRestocks), each with its
	// key, so a restock applied twice would show.
	Restocked int64
	Restocks  []Restock
	Available int64
	// Ordered is the units of the orders that hold stock (final, held or
	// paid), Orders their count.
	Ordered int64
	Orders  int64
	// Held and Paid split Ordered by state (a final order counts as paid).
	Held int64
	Paid int64
	// Returned is the units that cancelled and expired orders gave back;
	// Cancelled and Expired count those orders.
	Returned  int64
	Cancelled int64
	Expired   int64
	// Relaying is the units of the returned orders and the restocks not
	// yet given to the store that counts the stock outside the database
	// (the reservation strategies' Redis: the relay), RelayingOrders the
	// count of those orders: in flight between the two.
	Relaying       int64
	RelayingOrders int64
	// Sale is the number of the SKU's current sale in the database
	// (sale_epoch): it grows with every StartSale.
	Sale int64
	// Pending counts the accepted orders not yet written to the database,
	// Lag the age of the oldest of them: both stay 0 for the strategies
	// that write each order in its own transaction (redis-reserve).
	Pending int64
	Lag     time.Duration
	// Written is the database's own audit when the stock is counted
	// elsewhere (redis-reserve), nil otherwise; Drift says how it
	// disagrees with the count, "" when it does not.
	Written *Audit
	Drift   string
}

// Consistent holds when no unit was oversold, every unit that left the
// stock is in an order, and the database agrees with where the stock is
// counted.
func (a Audit) Consistent() bool {
	return a.Available >= 0 && a.Initial+a.Restocked == a.Available+a.Ordered && a.Drift == ""
}

// IdempotencyRecord remembers the order a request with an Idempotency-Key
// created. Only created orders are remembered: a sold-out answer stays true
// for a retry anyway (stock only falls until the next sale, which forgets
// every key), and busy or unavailable answers are meant to be retried.
type IdempotencyRecord struct {
	Key         string
	SKU         string
	RequestHash []byte
	OrderID     string
}

// The admin writes a client may retry: they carry an Idempotency-Key as
// orders do, recorded in the transaction of the write, so that a retry
// whose first answer was lost (a timeout, a 503) applies nothing more.
const (
	AdminStart   = "start"
	AdminRestock = "restock"
)

// AdminRecord remembers the admin write an Idempotency-Key made. Unlike an
// order's key, a new sale does not forget it (a retried restock must not
// land in the next sale); the stores keep it for AdminKeyRetention.
type AdminRecord struct {
	Key         string
	Action      string // AdminStart or AdminRestock
	SKU         string
	RequestHash []byte
	// Sale is the number of the sale the write started or restocked.
	Sale int64
	// RestockID is the restock the key made (AdminRestock).
	RestockID string
}

// AdminKeyRetention is how long an admin write's key is kept: a retry
// later than that is a new write.
const AdminKeyRetention = 24 * time.Hour

// SaleRequest asks for a new sale of SKU: Available units, orders taken
// within Window, the SKU's orders, buyers' counts and order keys
// forgotten. IdempotencyKey, when set, makes a retry answer the first
// start without starting the sale again.
type SaleRequest struct {
	SKU            string
	Available      int64
	Window         SaleWindow
	IdempotencyKey string
}

// Validate reports the first rule the request breaks, wrapped in ErrInvalid.
func (r SaleRequest) Validate() error {
	if err := ValidateSKU(r.SKU); err != nil {
		return err
	}
	if err := ValidateInitialStock(r.Available); err != nil {
		return err
	}
	if err := r.Window.Validate(); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

// Fingerprint identifies the content of the request, as Request's does.
func (r SaleRequest) Fingerprint() []byte {
	h := sha256.New()
	for _, s := range []string{AdminStart, r.SKU} {
		_ = binary.Write(h, binary.BigEndian, uint32(len(s)))
		h.Write([]byte(s))
	}
	_ = binary.Write(h, binary.BigEndian, r.Available)
	// Microseconds, the precision both engines keep; the zero time (no
	// bound) as its own value.
	for _, t := range []time.Time{r.Window.StartsAt, r.Window.EndsAt} {
		var us int64 = math.MinInt64
		if !t.IsZero() {
			us = t.UnixMicro()
		}
		_ = binary.Write(h, binary.BigEndian, us)
	}
	return h.Sum(nil)
}

// RestockRequest asks for Quantity more units of SKU's current sale, its
// orders kept. IdempotencyKey, when set, makes a retry answer the first
// restock and add nothing.
type RestockRequest struct {
	SKU            string
	Quantity       int64
	IdempotencyKey string
}

// Validate reports the first rule the request breaks, wrapped in ErrInvalid.
func (r RestockRequest) Validate() error {
	if err := ValidateSKU(r.SKU); err != nil {
		return err
	}
	if r.Quantity < 1 || r.Quantity > MaxInitialStock {
		return fmt.Errorf("%w: quantity must be an integer from 1 to %d", ErrInvalid, MaxInitialStock)
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

// Fingerprint identifies the content of the request, as Request's does.
func (r RestockRequest) Fingerprint() []byte {
	h := sha256.New()
	for _, s := range []string{AdminRestock, r.SKU} {
		_ = binary.Write(h, binary.BigEndian, uint32(len(s)))
		h.Write([]byte(s))
	}
	_ = binary.Write(h, binary.BigEndian, r.Quantity)
	return h.Sum(nil)
}

// Restock is one restock of a sale, as recorded: the audit lists them.
type Restock struct {
	ID       string
	SKU      string
	Quantity int64
	// Key is the admin's Idempotency-Key, "" without one.
	Key string
	// At is when it was recorded, on the database's clock.
	At time.Time
}

// Restocked is the answer to a restock: the restock, the SKU's stock after
// it, and whether it is a retry's answer (Replayed: nothing was added).
type Restocked struct {
	Restock  Restock
	Level    Level
	Replayed bool
}

// SaleStarted is the answer to a sale's start; Replayed when it is a
// retry's answer (nothing was started again).
type SaleStarted struct {
	Request  SaleRequest
	Replayed bool
}

// NotLanded is the error of a write whose commit answer was lost
// (commitErr, an ErrOutcomeUnknown) and which a final lookup found did not
// land: nothing was written. It is ErrUnavailable, no longer
// ErrOutcomeUnknown (the outcome is known), and keeps the causes commitErr
// wrapped beside ErrOutcomeUnknown (the driver's error).
func NotLanded(what string, commitErr error) error {
	return notLanded{what: what, commitErr: commitErr}
}

type notLanded struct {
	what      string
	commitErr error
}

func (e notLanded) Error() string {
	return fmt.Sprintf("%s: the database lost the commit's answer, and a lookup found it did not land: nothing was written (%v)", e.what, e.commitErr)
}

func (e notLanded) Unwrap() []error {
	causes := []error{ErrUnavailable}
	if multi, ok := e.commitErr.(interface{ Unwrap() []error }); ok {
		for _, c := range multi.Unwrap() {
			if c != ErrOutcomeUnknown {
				causes = append(causes, c)
			}
		}
	}
	return causes
}

// Pause waits d before an order tries again, or less if ctx ends first:
// then it reports ErrBusy with the context's cause (the order ran out of
// time waiting its turn, which the client may retry).
func Pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if err := backoff.Wait(ctx, d); err != nil {
		return fmt.Errorf("%w: %w", ErrBusy, err)
	}
	return nil
}
