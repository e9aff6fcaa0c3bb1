
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. now, 'NX', 'PX', ARGV[2]) then return 1 end
return 0
