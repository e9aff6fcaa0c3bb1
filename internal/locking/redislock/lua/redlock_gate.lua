
if gone(KEYS[1], ARGV[1]) then return {0, 0, ''} end
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  local mine = find(KEYS[3], ARGV[4])
  if mine then redis.call('LREM', KEYS[3], 0, mine) end
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0'), ''}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local head
while true do
  head = redis.call('LINDEX', KEYS[3], 0)
  if not head then break end
  local dl = string.match(head, '^(%d+):')
  if dl and tonumber(dl) > now then break end
  redis.call('LPOP', KEYS[3])
end
local suffix = ':' .. ARGV[4]
local first = head and string.sub(head, -#suffix) == suffix
if not cur and (not head or first) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if first then redis.call('LPOP', KEYS[3]) end
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0'), ''}
end
local old = find(KEYS[3], ARGV[4])
local e = element(ARGV[3], ARGV[2], 'redlock', ARGV[4])
if old then
  redis.call('LSET', KEYS[3], redis.call('LPOS', KEYS[3], old), e)
else
  redis.call('RPUSH', KEYS[3], e)
end
if cur then return {0, redis.call('PTTL', KEYS[1]), e} end
return {-1, 0, e}
