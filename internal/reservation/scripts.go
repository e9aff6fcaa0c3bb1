package reservation

import "github.com/redis/go-redis/v9"

// Keys of one SKU S (after the prefix). Every key of a SKU carries the hash
// tag {S}, so one script reaches them all on Redis Cluster too: a SKU lives
// on one master.
//
//	{S}:sale      hash: epoch, initial, available, ordered, orders; base
//	              (the epoch it was loaded under: a renumbering keeps it)
//	              and replid (the replication id it was last checked
//	              under). Its absence means "no sale here": never loaded,
//	              closed for a restart, or lost with the server's data.
//	{S}:epoch     the highest sale epoch ever announced (Close) or loaded,
//	              so a late Load of an older sale is refused.
//	{S}:keys      hash: idempotency key -> "fingerprint orderID".
//	{S}:orders    stream: the accepted orders not yet in the database, one
//	              entry each (id, q, u, k, h, e, s: order id, quantity, user,
//	              key, fingerprint, sale epoch, strategy); group "persist".
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
const luaReplID = `
local function replid()
  local info = redis.call('INFO', 'replication')
  if not string.find(info, 'role:master', 1, true) then return false end
  return string.match(info, 'master_replid:(%w+)')
end
`

// reserveScript checks, decrements and logs one order atomically.
//
// KEYS: sale, keys, orders, placed. ARGV: order id, quantity, user id,
// idempotency key ("" for none), request fingerprint (hex), how long the
// answer is kept (ms), the strategy's name (recorded on the order).
//
// Replies: {"ok", id} (taken now or by an earlier run of this very call),
// {"replay", id} (the key's earlier order), {"conflict"}, {"soldout"},
// {"unloaded"}, {"checking"} (a check of the sale is under way), {"unchecked"}
// (the server's replication id is not the one the sale was checked under).
var reserveScript = redis.NewScript(luaReplID + `
local sale = redis.call('HMGET', KEYS[1], 'epoch', 'available', 'base', 'replid', 'since')
if not sale[1] then return {'unloaded'} end
if string.sub(sale[4] or '', 1, 9) == 'checking:' then
  -- A check under way; one that has lasted 2 s is taken for dead.
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now - tonumber(sale[5] or '0') < 2000 then return {'checking'} end
  return {'unchecked'}
end
local id = replid()
if not id or sale[4] ~= id then return {'unchecked'} end
if redis.call('GET', KEYS[4]) == sale[3] then return {'ok', ARGV[1]} end
local key, fp = ARGV[4], ARGV[5]
if key ~= '' then
  local prior = redis.call('HGET', KEYS[2], key)
  if prior then
    local sep = string.find(prior, ' ', 1, true)
    if string.sub(prior, 1, sep - 1) ~= fp then return {'conflict'} end
    return {'replay', string.sub(prior, sep + 1)}
  end
end
local q = tonumber(ARGV[2])
if tonumber(sale[2]) < q then return {'soldout'} end
redis.call('HINCRBY', KEYS[1], 'available', -q)
redis.call('HINCRBY', KEYS[1], 'ordered', q)
redis.call('HINCRBY', KEYS[1], 'orders', 1)
redis.call('XADD', KEYS[3], '*', 'id', ARGV[1], 'q', ARGV[2], 'u', ARGV[3], 'k', key, 'h', fp, 'e', sale[1], 's', ARGV[7])
if key ~= '' then redis.call('HSET', KEYS[2], key, fp .. ' ' .. ARGV[1]) end
redis.call('SET', KEYS[4], sale[3], 'PX', ARGV[6])
return {'ok', ARGV[1]}
`)

// closeScript stops a SKU's sale and announces the next one: no sale older
// than it can be loaded afterwards. It returns the highest number seen
// before, so the caller can tell a database whose numbers are behind.
//
// KEYS: sale, epoch. ARGV: the announced epoch.
var closeScript = redis.NewScript(`
redis.call('DEL', KEYS[1])
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) > seen then redis.call('SET', KEYS[2], ARGV[1]) end
return seen
`)

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
// KEYS: sale, epoch, keys, orders. ARGV: epoch, units, consumer group.
var loadScript = redis.NewScript(luaReplID + `
local id = replid()
if not id then return redis.error_reply('READONLY this server is not a master') end
local e = tonumber(ARGV[1])
local loaded = tonumber(redis.call('GET', KEYS[2]) or '0')
if e < loaded then
  return redis.error_reply('STALE sale ' .. ARGV[1] .. ' is older than sale ' .. loaded .. ', started since')
end
if e == loaded and redis.call('HGET', KEYS[1], 'epoch') == ARGV[1] then return 'OK' end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('SET', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('XTRIM', KEYS[4], 'MAXLEN', 0)
  redis.call('XGROUP', 'DESTROY', KEYS[4], ARGV[3])
end
redis.call('XGROUP', 'CREATE', KEYS[4], ARGV[3], '$', 'MKSTREAM')
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'initial', ARGV[2], 'available', ARGV[2], 'ordered', 0, 'orders', 0,
  'base', ARGV[1], 'replid', id)
return 'OK'
`)

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
var blockScript = redis.NewScript(luaReplID + `
local sale = redis.call('HMGET', KEYS[1], 'epoch', 'replid')
if not sale[1] then return 0 end
local id = replid()
if id and sale[2] == id and ARGV[2] ~= 'force' then return 2 end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'replid', 'checking:' .. ARGV[1], 'since', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
return 1
`)

// renumberScript moves a sale under check from epoch ARGV[1] to ARGV[2]
// (the number the database gives it to fence off older batches); its stock
// and orders stay, and it stays stopped until unblockScript, after the
// database has committed the number. It answers "GONE" when no sale is
// open, "MOVED" when the sale is no longer ARGV[1] or no longer stopped by
// this check (ARGV[3]).
//
// KEYS: sale, epoch.
var renumberScript = redis.NewScript(`
local e = redis.call('HGET', KEYS[1], 'epoch')
if not e then return 'GONE' end
if e ~= ARGV[1] or redis.call('HGET', KEYS[1], 'replid') ~= 'checking:' .. ARGV[3] then return 'MOVED' end
if not redis.call('HGET', KEYS[1], 'base') then redis.call('HSET', KEYS[1], 'base', ARGV[1]) end
redis.call('HSET', KEYS[1], 'epoch', ARGV[2])
if tonumber(ARGV[2]) > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], ARGV[2]) end
return 'OK'
`)

// unblockScript lets a checked sale sell again, under the server's current
// replication id, if it still has the number the check committed and is
// still stopped by that check (ARGV[2]): a check that began meanwhile keeps
// it stopped until its own end (found by TestBurstAcrossThreeInstances: an
// earlier check's unblock let orders in under a later check's tally, which
// then took them for lost ones and closed the sale).
//
// KEYS: sale. ARGV: epoch, the check's token.
var unblockScript = redis.NewScript(luaReplID + `
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'replid') ~= 'checking:' .. ARGV[2] then return 0 end
local id = replid()
if not id then return 0 end
redis.call('HSET', KEYS[1], 'replid', id)
return 1
`)

// tallyScript reads a sale's bookkeeping, its backlog and the age of its
// oldest unwritten order, on the clock of the server that holds them.
//
// KEYS: sale, orders. Reply: {epoch, initial, available, ordered, orders,
// backlog, age ms} or {} when no sale is loaded.
var tallyScript = redis.NewScript(`
local s = redis.call('HMGET', KEYS[1], 'epoch', 'initial', 'available', 'ordered', 'orders')
if not s[1] then return {} end
local backlog, age = 0, 0
if redis.call('EXISTS', KEYS[2]) == 1 then
  backlog = redis.call('XLEN', KEYS[2])
  local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
  if first then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    age = math.max(0, now - tonumber(string.match(first[1], '^(%d+)')))
  end
end
return {tonumber(s[1]), tonumber(s[2]), tonumber(s[3]), tonumber(s[4]), tonumber(s[5]), backlog, age}
`)

// retireScript takes a SKU off the catalog if no sale newer than the one
// the caller found sold out and drained was announced since: a StartSale
// raises the score above it (Close, ZADD GT), and then the SKU stays. A
// score of 0 is a listing by a consumer (Consumer.relist).
//
// KEYS: catalog. ARGV: sku, the number (base) of the sale found finished.
var retireScript = redis.NewScript(`
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
`)

// abandonScript marks a failed check's stop as dead at once: the reserve
// script then answers "unchecked" instead of "checking", and the next order
// checks the sale again without waiting out the 2 s in which a check is
// presumed alive. The sale stays stopped; only the check's own stop is
// touched.
//
// KEYS: sale. ARGV: the check's token.
var abandonScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'replid') ~= 'checking:' .. ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'since', 0)
return 1
`)
