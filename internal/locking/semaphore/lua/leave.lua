
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local queued = redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local until_ = redis.call('ZSCORE', KEYS[1], ARGV[1])
local held = redis.call('ZREM', KEYS[1], ARGV[1])
if (held == 1 or queued == 1) and redis.call('ZCARD', KEYS[2]) > 0 then
  redis.call('PUBLISH', KEYS[5], '')
end
if held == 1 and tonumber(until_) > now then return 1 end
return 0
