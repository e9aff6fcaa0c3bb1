
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'replid') ~= 'checking:' .. ARGV[2] then return 0 end
local id = replid()
if not id then return 0 end
redis.call('HSET', KEYS[1], 'replid', id)
return 1
