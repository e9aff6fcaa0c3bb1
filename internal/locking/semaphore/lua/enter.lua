
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- The waiters that stopped asking leave, in slices: unpack() of a few
-- thousand ids fails in Redis's Lua, and a script that fails here would
-- fail every later ask of the name (found by review: 8,200 dead waiters).
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for i = 1, #gone, 500 do
  redis.call('ZREM', KEYS[2], unpack(gone, i, math.min(i + 499, #gone)))
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local id = ARGV[1]
local result = 1
if not redis.call('ZSCORE', KEYS[1], id) then
  if not redis.call('ZSCORE', KEYS[2], id) then
    redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), id)
  end
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), id)
  local free = tonumber(ARGV[2]) - redis.call('ZCARD', KEYS[1])
  local place = redis.call('ZRANK', KEYS[2], id)
  if place < free then
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), id)
  else
    result = -(1 + place)
  end
end
-- Every key lives a while past its last use, set after the writes above
-- (an expiry set before the ZADD that creates a key is lost: found by
-- review), and never shortened: a process with a shorter lease must not
-- make a longer lease's holder vanish with the key (found by review).
local idle = 2 * (tonumber(ARGV[3]) + tonumber(ARGV[4]))
for i = 1, 4 do
  local ttl = redis.call('PTTL', KEYS[i])
  if ttl == -1 or (ttl >= 0 and ttl < idle) then redis.call('PEXPIRE', KEYS[i], idle) end
end
return result
