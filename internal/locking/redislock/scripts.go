package redislock

import "github.com/redis/go-redis/v9"

// Keys of one lock named K (after the prefix):
//
//	K        the lock: a random token per holder, with a PX expiry
//	K:fence  the fencing counter; it never expires (see doc.go)
//	K:queue  waiting processes, oldest first, as
//	         "deadlineMs:ttlMs:locker:token" (deadline on the server's clock;
//	         locker is the random id of the waiter's Locker). Redlock keeps
//	         it on the key's gate node only, with locker "redlock".
//	K:wake:L single node: the channel of Locker L for K; "token fence" hands
//	         the lock to token, "" asks its waiters to poll again (Reset).
//	         One channel per Locker and key, not one per key, so a hand-over
//	         wakes only the process it concerns.
//	K:wake   Redlock: "token" says token released K, so the waiters that
//	         lost to it try again; "" asks them to poll (Reset)
//	K:gone:V a tombstone: value V was released (or its waiter gave up),
//	         for one lock TTL. A call for V that the client gave up on may
//	         still reach the server after the release; the scripts that
//	         set K or queue a waiter refuse V while its tombstone lives, so
//	         such a late call cannot create the lock again under a value
//	         nobody will delete (blocking K for a TTL). A value is never
//	         used again after its release.

// luaGone is true when value has a tombstone (see K:gone:V above).
const luaGone = `
local function gone(lock, value)
  return redis.call('EXISTS', lock .. ':gone:' .. value) == 1
end
`

// luaPromote hands a free lock to the oldest waiter whose deadline has not
// passed, increments the fence for it and, unless it is skip, publishes the
// hand-over on the waiter's channel (lock..':wake:'..locker). Waiters that
// gave up or died are skipped on the way, and so is an entry whose token
// has a tombstone (K:gone:V): a late call may have queued a value that was
// released or gave up since, and a lock handed to it would block K for a
// TTL, held by nobody.
const luaPromote = `
local function promote(lock, fence, queue, skip)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while true do
    local e = redis.call('LPOP', queue)
    if not e then return false, 0 end
    local dl, ttl, id, tok = string.match(e, '^(%d+):(%d+):([^:]+):(.+)$')
    if dl and tonumber(dl) > now and redis.call('EXISTS', lock .. ':gone:' .. tok) == 0 then
      redis.call('SET', lock, tok, 'PX', ttl)
      local f = redis.call('INCR', fence)
      -- %d: a Lua number is a double, which .. writes as 1e+14 from 10^14.
      if tok ~= skip then redis.call('PUBLISH', lock .. ':wake:' .. id, string.format('%s %d', tok, f)) end
      return tok, f
    end
  end
end
-- find returns tok's entry in the queue, or false.
local function find(queue, tok)
  local suffix = ':' .. tok
  for _, e in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    if string.sub(e, -#suffix) == suffix then return e end
  end
  return false
end
local function element(wait, ttl, id, tok)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return string.format('%d:%d:%s:%s', now + tonumber(wait), tonumber(ttl), id, tok)
end
`

// singleAcquire: KEYS lock, fence, queue; ARGV token, ttl ms, wait ms, our
// queue element ("" if none, "?" if an earlier call's outcome is unknown),
// locker id. A released token (tombstone) changes nothing: {0, 0, ""}.
// Returns {fence, pttl, element}: fence > 0
// when the lock is ours (pttl is then its remaining life, also when it was
// handed to us earlier); else pttl is the holder's remaining life and element
// our place in the queue. It is idempotent, so it doubles as the poll.
//
// A free lock is taken with SET NX PX and the fence incremented in the same
// script, so a holder never exists without its fencing token. A free lock
// with waiters queued goes to the oldest waiter, not to the caller: that is
// what makes the lock fair across processes.
var singleAcquire = redis.NewScript(luaPromote + luaGone + `
if gone(KEYS[1], ARGV[1]) then return {0, 0, ''} end
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  return {tonumber(redis.call('GET', KEYS[2]) or '0'), redis.call('PTTL', KEYS[1]), ''}
end
if not cur then
  if redis.call('LLEN', KEYS[3]) > 0 then
    local tok, f = promote(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
    if tok == ARGV[1] then return {f, redis.call('PTTL', KEYS[1]), ''} end
    cur = tok
  end
  if not cur then
    redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
    return {redis.call('INCR', KEYS[2]), tonumber(ARGV[2]), ''}
  end
end
local e = ARGV[4]
if e == '?' then
  e = find(KEYS[3], ARGV[1]) or ''
elseif e ~= '' and not redis.call('LPOS', KEYS[3], e) then
  e = ''
end
if e == '' then
  e = element(ARGV[3], ARGV[2], ARGV[5], ARGV[1])
  redis.call('RPUSH', KEYS[3], e)
end
return {0, redis.call('PTTL', KEYS[1]), e}
`)

// singleLeave: KEYS lock, fence, queue; ARGV token, our queue element ("",
// or "?" to find it by token), successor token or "", successor ttl ms,
// successor wait ms, channel, lock ttl ms. It leaves a tombstone for token
// (K:gone:token, for the lock ttl), whatever it finds: a late call of ours
// then changes nothing. Returns {held, fence, element}. held is 1 when the lock was ours and is
// released, 0 when it was gone (expired), -1 when someone else holds it: a
// release never touches another holder's lock. With a successor (the next
// waiter of this process), fence > 0 means the lock went straight to it,
// else element is its place in the queue (at the end, or the place it
// already had). A freed lock goes to the oldest queued waiter and the
// hand-over is published.
//
// This call may land late, after the client gave up on it and the
// successor went on by itself (it polls, so it may be queued already, or
// it may have given up and left its tombstone): a successor with a
// tombstone gets nothing, and one already queued keeps its one place
// instead of being queued twice (a second entry would get the lock after
// the successor released it, under a value nobody will delete).
var singleLeave = redis.NewScript(luaPromote + luaGone + `
redis.call('SET', KEYS[1] .. ':gone:' .. ARGV[1], '1', 'PX', ARGV[7])
if ARGV[2] == '?' then
  local e = find(KEYS[3], ARGV[1])
  if e then redis.call('LREM', KEYS[3], 0, e) end
elseif ARGV[2] ~= '' then
  redis.call('LREM', KEYS[3], 1, ARGV[2])
end
local cur = redis.call('GET', KEYS[1])
local held = -1
if cur == ARGV[1] then
  held = 1
  redis.call('DEL', KEYS[1])
  cur = false
elseif not cur then
  held = 0
end
local succ = ARGV[3]
local queued = false
if succ ~= '' then
  if gone(KEYS[1], succ) then
    succ = ''
  else
    queued = find(KEYS[3], succ)
  end
end
if not cur then
  if succ ~= '' and not queued and redis.call('LLEN', KEYS[3]) == 0 then
    redis.call('SET', KEYS[1], succ, 'PX', ARGV[4])
    return {held, redis.call('INCR', KEYS[2]), ''}
  end
  local tok, f = promote(KEYS[1], KEYS[2], KEYS[3], '')
  if succ ~= '' and tok == succ then return {held, f, ''} end
  if succ ~= '' and not queued and not tok then
    redis.call('SET', KEYS[1], succ, 'PX', ARGV[4])
    return {held, redis.call('INCR', KEYS[2]), ''}
  end
end
if succ == '' then return {held, 0, ''} end
if queued then return {held, 0, queued} end
local e = element(ARGV[5], ARGV[4], ARGV[6], succ)
redis.call('RPUSH', KEYS[3], e)
return {held, 0, e}
`)

// singleExtend: KEYS lock; ARGV token, ttl ms. Compare-and-pexpire: 1 when
// the lock is ours and renewed, else 0.
var singleExtend = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// resetScript: KEYS lock, fence, queue; ARGV ttl ms. Deletes the lock and
// its queue and tells waiters (queued ones on their Locker's channel,
// Redlock ones on the shared channel) to poll again: their places in line
// are gone. The removed value gets a tombstone (K:gone:V) that outlives
// the key it replaces (its remaining life, at least ttl): the holder's next
// renewal comes before the key would have expired, and Redlock's renewal
// takes a missing key back unless the value has a tombstone, so without it
// a holder that keeps renewing would just take the lock back and Reset
// would free nothing. A late call of the value cannot set it again either.
// The fencing counter stays: tokens only ever grow, across Resets too, or a
// store that kept the highest token it accepted would refuse every later
// holder.
var resetScript = redis.NewScript(`
for _, e in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local id = string.match(e, '^%d+:%d+:([^:]+):')
  if id then redis.call('PUBLISH', KEYS[1] .. ':wake:' .. id, '') end
end
local cur = redis.call('GET', KEYS[1])
if cur then
  local life = math.max(redis.call('PTTL', KEYS[1]), tonumber(ARGV[1]))
  redis.call('SET', KEYS[1] .. ':gone:' .. cur, '1', 'PX', life)
end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('PUBLISH', KEYS[1] .. ':wake', '')
return 1
`)

// redlockAcquire: KEYS lock, fence; ARGV token, ttl ms, proposed counter (0
// for none). Returns {1, counter, ""} when the lock on this node is ours
// (taken now with SET NX PX, or already ours from an earlier round), else
// {0, holder's pttl, holder}. The counter is read in the same script as the
// SET: that is what the fencing argument in doc.go relies on. With a
// proposal, the counter is raised to it (set-if-greater) in that same
// script, after the read: the reply is the counter as it was before, so the
// caller can tell whether its proposal was above every earlier one
// (doc.go). A released
// token (tombstone) does not take a free key: {0, 0, ""}.
var redlockAcquire = redis.NewScript(luaGone + `
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif cur or gone(KEYS[1], ARGV[1]) or not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if not cur then return {0, 0, ''} end
  return {0, redis.call('PTTL', KEYS[1]), cur}
end
local old = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[3]) > old then redis.call('SET', KEYS[2], ARGV[3]) end
return {1, old, ''}
`)

// redlockGate: KEYS lock, fence, queue; ARGV token (the lock's value), ttl
// ms, entry life ms (each call sets the caller's entry to expire that long
// from now), queue id (the caller's name in the queue, which outlives the
// tokens of its failed rounds). The
// gate of a Redlock key (one node, see quorum.tryGate): waiters whose wait
// ended are dropped from the head of the queue; a free lock goes to the
// caller only if nobody is queued or the caller is first in line. Returns
// {1, counter, ""} when the lock on this node is ours (counter: this node's
// fencing counter, from which the caller proposes its token), {0, pttl, element} when
// someone holds it, {-1, 0, element} when it is free but an older waiter is
// first; element is the caller's place in the queue. A released token
// (tombstone) changes nothing: {0, 0, ""}.
var redlockGate = redis.NewScript(luaPromote + luaGone + `
if gone(KEYS[1], ARGV[1]) then return {0, 0, ''} end
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  local mine = find(KEYS[3], ARGV[4])
  if mine then redis.call('LREM', KEYS[3], 0, mine) end
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0'), ''}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local head
while true do
  head = redis.call('LINDEX', KEYS[3], 0)
  if not head then break end
  local dl = string.match(head, '^(%d+):')
  if dl and tonumber(dl) > now then break end
  redis.call('LPOP', KEYS[3])
end
local suffix = ':' .. ARGV[4]
local first = head and string.sub(head, -#suffix) == suffix
if not cur and (not head or first) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if first then redis.call('LPOP', KEYS[3]) end
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0'), ''}
end
local old = find(KEYS[3], ARGV[4])
local e = element(ARGV[3], ARGV[2], 'redlock', ARGV[4])
if old then
  redis.call('LSET', KEYS[3], redis.call('LPOS', KEYS[3], old), e)
else
  redis.call('RPUSH', KEYS[3], e)
end
if cur then return {0, redis.call('PTTL', KEYS[1]), e} end
return {-1, 0, e}
`)

// redlockGateLeave: KEYS lock, fence, queue; ARGV queue id, token of a
// contender that gives up ("" for none), ttl ms. Removes the caller's place
// in the gate's queue. With a token, also deletes the lock if a gate call
// of that token set it, and leaves the token's tombstone, so a gate call
// that lands later changes nothing.
var redlockGateLeave = redis.NewScript(luaPromote + `
local e = find(KEYS[3], ARGV[1])
if e then redis.call('LREM', KEYS[3], 0, e) end
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[1] .. ':gone:' .. ARGV[2], '1', 'PX', ARGV[3])
  if redis.call('GET', KEYS[1]) == ARGV[2] then redis.call('DEL', KEYS[1]) end
end
return 1
`)

// redlockFence: KEYS lock, fence; ARGV token, counter. Set-if-greater of the
// fencing counter, only on a node where the lock is ours: 1 when done.
var redlockFence = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
`)

// redlockExtend: KEYS lock, fence; ARGV token, ttl ms, counter. Renews the lock
// if ours; if the key is missing (the node restarted empty) it takes it back,
// which is safe because the caller still holds a valid majority; and it
// raises the node's fencing counter to ours, healing a wiped counter.
// A released token (tombstone) does not take the key back.
// Returns 1 when the lock on this node is ours afterwards, else 0.
var redlockExtend = redis.NewScript(luaGone + `
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif not cur and not gone(KEYS[1], ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  return 0
end
if tonumber(ARGV[3]) > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], ARGV[3])
end
return 1
`)

// redlockRelease: KEYS lock; ARGV token, channel, publish ("1" or "0"), ttl
// ms. Leaves a tombstone for token (K:gone:token, for the ttl) whatever it
// finds, so a call of ours that lands later changes nothing.
// Compare-and-delete, then (unless told not to) publish our token so
// waiters that lost to us try again. A contender undoing a failed round
// publishes only if it held the gate while nobody held a majority: then
// the waiters queued behind it at the gate would otherwise sleep until they
// poll.
// Returns 1 when released, 0 when the key was gone, -1 when someone else
// holds it.
var redlockRelease = redis.NewScript(`
redis.call('SET', KEYS[1] .. ':gone:' .. ARGV[1], '1', 'PX', ARGV[4])
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[3] == '1' then redis.call('PUBLISH', ARGV[2], ARGV[1]) end
  return 1
end
if not cur then return 0 end
return -1
`)

// advanceFence: KEYS fence; ARGV n. Set-if-greater of the fencing counter,
// whoever holds the lock: the next acquisition then takes a counter above n
// (AdvanceFence passes counterFloor of the token it was given).
var advanceFence = redis.NewScript(`
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
`)
