
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local sep = string.find(v, ' ', 1, true)
if string.sub(v, 1, sep - 1) ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = tonumber(string.sub(v, sep + 1)) + tonumber(ARGV[2])
if keep > now then
  redis.call('PEXPIREAT', KEYS[1], keep)
else
  redis.call('DEL', KEYS[1])
end
return 1
