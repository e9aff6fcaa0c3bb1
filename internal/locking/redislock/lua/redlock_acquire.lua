
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif cur or gone(KEYS[1], ARGV[1]) or not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if not cur then return {0, 0, ''} end
  return {0, redis.call('PTTL', KEYS[1]), cur}
end
local old = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[3]) > old then redis.call('SET', KEYS[2], ARGV[3]) end
return {1, old, ''}
