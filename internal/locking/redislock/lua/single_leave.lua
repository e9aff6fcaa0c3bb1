
redis.call('SET', KEYS[1] .. ':gone:' .. ARGV[1], '1', 'PX', ARGV[7])
if ARGV[2] == '?' then
  local e = find(KEYS[3], ARGV[1])
  if e then redis.call('LREM', KEYS[3], 0, e) end
elseif ARGV[2] ~= '' then
  redis.call('LREM', KEYS[3], 1, ARGV[2])
end
local cur = redis.call('GET', KEYS[1])
local held = -1
if cur == ARGV[1] then
  held = 1
  redis.call('DEL', KEYS[1])
  cur = false
elseif not cur then
  held = 0
end
local succ = ARGV[3]
local queued = false
if succ ~= '' then
  if gone(KEYS[1], succ) then
    succ = ''
  else
    queued = find(KEYS[3], succ)
  end
end
if not cur then
  if succ ~= '' and not queued and redis.call('LLEN', KEYS[3]) == 0 then
    redis.call('SET', KEYS[1], succ, 'PX', ARGV[4])
    return {held, redis.call('INCR', KEYS[2]), ''}
  end
  local tok, f = promote(KEYS[1], KEYS[2], KEYS[3], '')
  if succ ~= '' and tok == succ then return {held, f, ''} end
  if succ ~= '' and not queued and not tok then
    redis.call('SET', KEYS[1], succ, 'PX', ARGV[4])
    return {held, redis.call('INCR', KEYS[2]), ''}
  end
end
if succ == '' then return {held, 0, ''} end
if queued then return {held, 0, queued} end
local e = element(ARGV[5], ARGV[4], ARGV[6], succ)
redis.call('RPUSH', KEYS[3], e)
return {held, 0, e}
