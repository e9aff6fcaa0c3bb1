
local function gone(lock, value)
  return redis.call('EXISTS', lock .. ':gone:' .. value) == 1
end
