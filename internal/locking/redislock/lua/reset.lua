
for _, e in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local id = string.match(e, '^%d+:%d+:([^:]+):')
  if id then redis.call('PUBLISH', KEYS[1] .. ':wake:' .. id, '') end
end
local cur = redis.call('GET', KEYS[1])
if cur then
  local life = math.max(redis.call('PTTL', KEYS[1]), tonumber(ARGV[1]))
  redis.call('SET', KEYS[1] .. ':gone:' .. cur, '1', 'PX', life)
end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('PUBLISH', KEYS[1] .. ':wake', '')
return 1
