package reservation

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Keys of one SKU S (after the prefix). Every key of a SKU carries the hash
// tag {S}, so one script reaches them all on Redis Cluster too: a SKU lives
// on one master.
//
//	{S}:sale      hash: epoch, initial, available, ordered, orders (every
//	              order taken), returned, returns (what came back),
//	              restocked (what restocks added); starts
//	              and ends (the sale's window, Unix µs, "": open); base
//	              (the epoch it was loaded under: a renumbering keeps it)
//	              and replid (the replication id it was last checked
//	              under). Its absence means "no sale here": never loaded,
//	              closed for a restart, or lost with the server's data.
//	{S}:epoch     the highest sale epoch ever announced (Close) or loaded,
//	              so a late Load of an older sale is refused.
//	{S}:keys      hash: idempotency key -> "fingerprint orderID".
//	{S}:orders    stream: the accepted orders not yet in the database, one
//	              entry each (id, q, u, k, h, e, s, hd: order id, quantity,
//	              user, key, fingerprint, sale epoch, strategy, hold in ms;
//	              k and h only with a key, hd only with a hold: a missing
//	              field is none); group "persist".
//	{S}:buyers    hash: user id -> units taken in the sale, kept only
//	              while orders carry a per-user limit (PER_USER_LIMIT).
//	{S}:returned  set: the orders whose units came back in the sale.
//	{S}:restocks  set: the restocks added to the sale.
//	{S}:open      present until the sale's end, when it has one (expiring
//	              then, in whole milliseconds rounded down): redis-watch
//	              watches it.
//	{S}:placed:ID the base of the sale in which order ID was taken, for a
//	              few minutes: a retry of the same call after a lost answer
//	              finds it instead of taking the stock twice.
//
// and one key outside every SKU's slot:
//
//	reserve:catalog sorted set: the SKUs on sale, scored with their latest
//	              sale's number (Store.Close); the consumers' sweep and the
//	              reconciler walk it, and a sale sold out and drained leaves
//	              it.

// Each script's source is a file in lua/, embedded byte for byte: Redis
// knows a script by the SHA1 of its source (EVALSHA), so a file keeps its
// leading and trailing newlines and gains no header; the comments here are
// the scripts' documentation. The helper luaReplID is prepended in Go to
// the scripts that call replid().

// luaReplID returns the server's replication id (INFO replication,
// master_replid), or false when the server is not a master. The id changes
// when the server is promoted, resynchronised from another, or started
// anew (a master restarted from its AOF or RDB takes a new one:
// TestRestartedRedisHasANewReplicationID pins that on the Redis the tests
// run). A sale remembers the id under which it was last checked against
// the database; under another id the server's data may be another history
// (a replica that lagged, a restored copy), and the reserve script answers
// "unchecked" until the sale is checked again (Store.recheck). A replica
// carries its master's id while its data lags behind, so a server that is
// not a master has no id here: a writable replica never sells, and a check
// on it never reopens a sale (found by review: a writable replica that
// lagged sold units its master had sold).
//
//go:embed lua/replid.lua
var luaReplID string

//go:embed lua/reserve.lua
var reserveSource string

// reserveScript checks, decrements and logs one order atomically.
//
// KEYS: sale, keys, orders, placed, buyers. ARGV: order id, quantity, user
// id, idempotency key ("" for none), request fingerprint (hex), how long the
// answer is kept (ms), the strategy's name (recorded on the order), the
// units one buyer may take in the sale (0: no limit, and the buyer's count
// is not kept), the order's hold (ms; 0: final), which the stream carries
// to the database: the hold's expires_at is set there, on the database's
// clock, when the order is written (a buyer can pay only from then on).
//
// The per-user limit is checked and counted in the same script as the
// stock, so no schedule of two orders of one buyer on two instances gets
// past it: the second script runs after the first has counted. The count
// lives in the sale's own history (a Redis restored from an older copy
// loses counts and orders together, and the check of the sale against the
// database, Store.checkSale, closes a sale whose Redis lost orders).
//
// Replies: {"ok", id} (taken now or by an earlier run of this very call),
// {"replay", id} (the key's earlier order), {"conflict"}, {"not_started"}
// and {"ended"} (outside the sale's window, on Redis's clock), {"limit"}
// (the buyer's units would pass the limit), {"soldout"},
// {"unloaded"}, {"checking"} (a check of the sale is under way), {"unchecked"}
// (the server's replication id is not the one the sale was checked under).
var reserveScript = redis.NewScript(luaReplID + reserveSource)

//go:embed lua/ack.lua
var ackSource string

// ackScript acknowledges entries of a SKU's stream and deletes them, at
// once: an entry acknowledged and left in the stream would keep the SKU in
// the working sets, read every round.
//
// KEYS: orders. ARGV: the group, then the entry ids.
var ackScript = redis.NewScript(ackSource)

//go:embed lua/close.lua
var closeSource string

// closeScript stops a SKU's sale and announces the next one: no sale older
// than it can be loaded afterwards. It returns the highest number seen
// before, so the caller can tell a database whose numbers are behind.
//
// KEYS: sale, epoch. ARGV: the announced epoch.
var closeScript = redis.NewScript(closeSource)

//go:embed lua/load.lua
var loadSource string

// loadScript opens a sale: it forgets the SKU's keys and unwritten orders
// (the database refuses orders of an older sale anyway) and sets the stock.
// Loading the sale that is open already is a no-op, so a retried call cannot
// wipe the orders taken since; a sale older than one announced or loaded is
// refused.
//
// The stream is emptied, not deleted: it keeps its last entry id, so every
// entry of the new sale has an id above every entry of the old. A consumer
// still holding old entries acknowledges and deletes them by id after the
// load; were the stream deleted, a new entry taken in the same millisecond
// as an old one could get the old one's id and be deleted unwritten. The
// group is created anew, so no old entry stays pending in it.
//
// KEYS: sale, epoch, keys, orders, buyers, returned, open, restocks. ARGV: epoch, units, consumer
// group, the window's start and end (Unix µs; "" for an open bound).
var loadScript = redis.NewScript(luaReplID + loadSource)

//go:embed lua/block.lua
var blockSource string

// blockScript stops the orders of an open sale for a check, which ARGV[1]
// names: the reserve script answers "checking" until that check's
// unblockScript (or a new load) writes a replication id again, or
// "unchecked" once the check has lasted 2 s (its checker died), so that
// another check takes over. Orders taken before it are in the stream. It
// answers 0 when no sale is open, 2 when the sale was checked under the
// server's current id meanwhile (another instance's check: nothing to do)
// unless the check is forced, 1 when it stopped the sale.
//
// KEYS: sale. ARGV: the check's token, "force" or "".
var blockScript = redis.NewScript(luaReplID + blockSource)

//go:embed lua/renumber.lua
var renumberSource string

// renumberScript moves a sale under check from epoch ARGV[1] to ARGV[2]
// (the number the database gives it to fence off older batches); its stock
// and orders stay, and it stays stopped until unblockScript, after the
// database has committed the number. It answers "GONE" when no sale is
// open, "MOVED" when the sale is no longer ARGV[1] or no longer stopped by
// this check (ARGV[3]).
//
// KEYS: sale, epoch.
var renumberScript = redis.NewScript(renumberSource)

//go:embed lua/unblock.lua
var unblockSource string

// unblockScript lets a checked sale sell again, under the server's current
// replication id, if it still has the number the check committed and is
// still stopped by that check (ARGV[2]): a check that began meanwhile keeps
// it stopped until its own end (found by TestBurstAcrossThreeInstances: an
// earlier check's unblock let orders in under a later check's tally, which
// then took them for lost ones and closed the sale).
//
// KEYS: sale. ARGV: epoch, the check's token.
var unblockScript = redis.NewScript(luaReplID + unblockSource)

//go:embed lua/return.lua
var returnSource string

// returnScript gives returned orders' units back to the sale, or adds
// restocks to it: each order or restock once per sale (the sets
// {S}:returned and {S}:restocks answer SADD with 1 only the first time),
// however often the relay hands it over, and only to the sale
// the database returned it in (the same sale number above the stride) and
// only while the sale was checked under the server's replication id. A
// Redis that came back from an older copy may not have taken the order at
// all: adding its units there would sell them twice, so the sale is
// checked first (Store.checkSale), which closes a sale whose Redis lost
// orders. The buyer's count (PER_USER_LIMIT) gives the units back too.
//
// KEYS: sale, returned (or restocks), buyers. ARGV: the database's sale
// number, the token of the check running it ("" for the relay), "return"
// or "restock", then order id, quantity, user id for each order (restock
// id, quantity for each restock). Replies "OK n" (n taken now),
// "unloaded", "checking", "unchecked", "other" (another sale), "moved" (the
// check's token no longer stops the sale).
var returnScript = redis.NewScript(luaReplID + returnSource)

//go:embed lua/tally.lua
var tallySource string

// tallyScript reads a sale's bookkeeping, its backlog and the age of its
// oldest unwritten order, on the clock of the server that holds them.
//
// KEYS: sale, orders. Reply: {epoch, initial, available, ordered, orders,
// backlog, age ms, returned, returns, restocked} or {} when no sale is
// loaded.
// ordered and orders count every order taken; returned and returns what
// came back (returnScript).
var tallyScript = redis.NewScript(tallySource)

//go:embed lua/retire.lua
var retireSource string

// retireScript takes a SKU off the catalog if no sale newer than the one
// the caller found sold out and drained was announced since: a StartSale
// raises the score above it (Close, ZADD GT), and then the SKU stays. A
// score of 0 is a listing by a consumer (Consumer.relist).
//
// KEYS: catalog. ARGV: sku, the number (base) of the sale found finished.
var retireScript = redis.NewScript(retireSource)

//go:embed lua/abandon.lua
var abandonSource string

// abandonScript marks a failed check's stop as dead at once: the reserve
// script then answers "unchecked" instead of "checking", and the next order
// checks the sale again without waiting out the 2 s in which a check is
// presumed alive. The sale stays stopped; only the check's own stop is
// touched.
//
// KEYS: sale. ARGV: the check's token.
var abandonScript = redis.NewScript(abandonSource)
