
local id = replid()
if not id then return redis.error_reply('READONLY this server is not a master') end
local e = tonumber(ARGV[1])
local loaded = tonumber(redis.call('GET', KEYS[2]) or '0')
if e < loaded then
  return redis.error_reply('STALE sale ' .. ARGV[1] .. ' is older than sale ' .. loaded .. ', started since')
end
if e == loaded and redis.call('HGET', KEYS[1], 'epoch') == ARGV[1] then return 'OK' end
if ARGV[6] == 'resume' and e ~= loaded then
  -- Resuming a start: only a server that holds the start's announcement
  -- (its close) may open the sale; one that lost it (wiped, or restored
  -- from an older copy) may also have lost orders the sale took.
  return redis.error_reply('LOST the announcement of sale ' .. ARGV[1] .. ' is not here (' .. loaded .. ')')
end
redis.call('DEL', KEYS[1], KEYS[3], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
if ARGV[5] ~= '' then
  -- Until the end, in whole milliseconds rounded down (redis-watch
  -- watches it: an EXEC sent before the end and landing after it applies
  -- nothing).
  redis.call('SET', KEYS[7], ARGV[1])
  redis.call('PEXPIREAT', KEYS[7], math.floor(tonumber(ARGV[5]) / 1000))
end
redis.call('SET', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('XTRIM', KEYS[4], 'MAXLEN', 0)
  redis.call('XGROUP', 'DESTROY', KEYS[4], ARGV[3])
end
redis.call('XGROUP', 'CREATE', KEYS[4], ARGV[3], '$', 'MKSTREAM')
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'initial', ARGV[2], 'available', ARGV[2], 'ordered', 0, 'orders', 0,
  'base', ARGV[1], 'replid', id, 'starts', ARGV[4], 'ends', ARGV[5])
return 'OK'
