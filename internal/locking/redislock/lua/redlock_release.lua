
redis.call('SET', KEYS[1] .. ':gone:' .. ARGV[1], '1', 'PX', ARGV[4])
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[3] == '1' then redis.call('PUBLISH', ARGV[2], ARGV[1]) end
  return 1
end
if not cur then return 0 end
return -1
