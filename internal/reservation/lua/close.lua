
redis.call('DEL', KEYS[1])
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) > seen then redis.call('SET', KEYS[2], ARGV[1]) end
return seen
