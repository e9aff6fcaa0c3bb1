
local e = find(KEYS[3], ARGV[1])
if e then redis.call('LREM', KEYS[3], 0, e) end
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[1] .. ':gone:' .. ARGV[2], '1', 'PX', ARGV[3])
  if redis.call('GET', KEYS[1]) == ARGV[2] then redis.call('DEL', KEYS[1]) end
end
return 1
