
local sale = redis.call('HMGET', KEYS[1], 'epoch', 'available', 'base', 'replid', 'since', 'starts', 'ends')
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
-- The order's placed key: "<base> <entry id>" once this very order was
-- taken (an earlier run of the call whose answer was lost), in this sale.
local placed = redis.call('GET', KEYS[4])
if placed then
  local sep = string.find(placed, ' ', 1, true)
  if (sep and string.sub(placed, 1, sep - 1) or placed) == sale[3] then
    -- Written again, unchanged: a WAIT after this script then covers the
    -- write that took the order (replicas.go).
    redis.call('SET', KEYS[4], placed, 'KEEPTTL')
    return {'ok', ARGV[1], sep and string.sub(placed, sep + 1) or ''}
  end
end
local key, fp = ARGV[4], ARGV[5]
if key ~= '' then
  local prior = redis.call('HGET', KEYS[2], key)
  if prior then
    local sep = string.find(prior, ' ', 1, true)
    if string.sub(prior, 1, sep - 1) ~= fp then return {'conflict'} end
    redis.call('HSET', KEYS[2], key, prior) -- for WAIT, as above
    return {'replay', string.sub(prior, sep + 1)}
  end
end
local starts, ends = tonumber(sale[6] or ''), tonumber(sale[7] or '')
if starts or ends then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if starts and now < starts then return {'not_started'} end
  if ends and now >= ends then return {'ended'} end
end
local q = tonumber(ARGV[2])
local limit = tonumber(ARGV[8])
if limit > 0 and tonumber(redis.call('HGET', KEYS[5], ARGV[3]) or '0') + q > limit then return {'limit'} end
if tonumber(sale[2]) < q then return {'soldout'} end
if limit > 0 then redis.call('HINCRBY', KEYS[5], ARGV[3], q) end
redis.call('HINCRBY', KEYS[1], 'available', -q)
redis.call('HINCRBY', KEYS[1], 'ordered', q)
redis.call('HINCRBY', KEYS[1], 'orders', 1)
-- Only the fields the order has: the consumer reads every field of every
-- entry, and a missing one means none (no key, no hold).
local entry = {'id', ARGV[1], 'q', ARGV[2], 'u', ARGV[3], 'e', sale[1], 's', ARGV[7]}
if key ~= '' then
  table.insert(entry, 'k'); table.insert(entry, key)
  table.insert(entry, 'h'); table.insert(entry, fp)
end
if ARGV[9] ~= '0' then
  table.insert(entry, 'hd'); table.insert(entry, ARGV[9])
end
if limit > 0 then
  -- Claimed on the buyer's count: its return gives this much back.
  table.insert(entry, 'c'); table.insert(entry, ARGV[2])
end
-- The entry's id is Redis's time of the order, in milliseconds: a held
-- order's hold runs from it.
local xid = redis.call('XADD', KEYS[3], '*', unpack(entry))
if key ~= '' then redis.call('HSET', KEYS[2], key, fp .. ' ' .. ARGV[1]) end
redis.call('SET', KEYS[4], sale[3] .. ' ' .. xid, 'PX', ARGV[6])
return {'ok', ARGV[1], xid}
