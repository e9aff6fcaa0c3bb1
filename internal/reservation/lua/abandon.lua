
if redis.call('HGET', KEYS[1], 'replid') ~= 'checking:' .. ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'since', 0)
return 1
