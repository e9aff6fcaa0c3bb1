
local function promote(lock, fence, queue, skip)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while true do
    local e = redis.call('LPOP', queue)
    if not e then return false, 0 end
    local dl, ttl, id, tok = string.match(e, '^(%d+):(%d+):([^:]+):(.+)$')
    if dl and tonumber(dl) > now and redis.call('EXISTS', lock .. ':gone:' .. tok) == 0 then
      redis.call('SET', lock, tok, 'PX', ttl)
      local f = redis.call('INCR', fence)
      -- %d: a Lua number is a double, which .. writes as 1e+14 from 10^14.
      if tok ~= skip then redis.call('PUBLISH', lock .. ':wake:' .. id, string.format('%s %d', tok, f)) end
      return tok, f
    end
  end
end
-- find returns tok's entry in the queue, or false.
local function find(queue, tok)
  local suffix = ':' .. tok
  for _, e in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    if string.sub(e, -#suffix) == suffix then return e end
  end
  return false
end
local function element(wait, ttl, id, tok)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return string.format('%d:%d:%s:%s', now + tonumber(wait), tonumber(ttl), id, tok)
end
