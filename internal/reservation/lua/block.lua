
local sale = redis.call('HMGET', KEYS[1], 'epoch', 'replid')
if not sale[1] then return 0 end
local id = replid()
if id and sale[2] == id and ARGV[2] ~= 'force' then return 2 end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'replid', 'checking:' .. ARGV[1], 'since', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
return 1
