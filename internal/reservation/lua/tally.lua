
local s = redis.call('HMGET', KEYS[1], 'epoch', 'initial', 'available', 'ordered', 'orders', 'returned', 'returns', 'restocked')
if not s[1] then return {} end
local backlog, age = 0, 0
if redis.call('EXISTS', KEYS[2]) == 1 then
  backlog = redis.call('XLEN', KEYS[2])
  local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
  if first then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    age = math.max(0, now - tonumber(string.match(first[1], '^(%d+)')))
  end
end
return {tonumber(s[1]), tonumber(s[2]), tonumber(s[3]), tonumber(s[4]), tonumber(s[5]), backlog, age,
  tonumber(s[6] or '0'), tonumber(s[7] or '0'), tonumber(s[8] or '0')}
