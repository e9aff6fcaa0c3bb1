
local e = redis.call('HGET', KEYS[1], 'epoch')
if not e then return 'GONE' end
if e ~= ARGV[1] or redis.call('HGET', KEYS[1], 'replid') ~= 'checking:' .. ARGV[3] then return 'MOVED' end
if not redis.call('HGET', KEYS[1], 'base') then redis.call('HSET', KEYS[1], 'base', ARGV[1]) end
redis.call('HSET', KEYS[1], 'epoch', ARGV[2])
if tonumber(ARGV[2]) > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], ARGV[2]) end
return 'OK'
