
if gone(KEYS[1], ARGV[1]) then return {0, 0, ''} end
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  return {tonumber(redis.call('GET', KEYS[2]) or '0'), redis.call('PTTL', KEYS[1]), ''}
end
if not cur then
  if redis.call('LLEN', KEYS[3]) > 0 then
    local tok, f = promote(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
    if tok == ARGV[1] then return {f, redis.call('PTTL', KEYS[1]), ''} end
    cur = tok
  end
  if not cur then
    redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
    return {redis.call('INCR', KEYS[2]), tonumber(ARGV[2]), ''}
  end
end
local e = ARGV[4]
if e == '?' then
  e = find(KEYS[3], ARGV[1]) or ''
elseif e ~= '' and not redis.call('LPOS', KEYS[3], e) then
  e = ''
end
if e == '' then
  e = element(ARGV[3], ARGV[2], ARGV[5], ARGV[1])
  redis.call('RPUSH', KEYS[3], e)
end
return {0, redis.call('PTTL', KEYS[1]), e}
