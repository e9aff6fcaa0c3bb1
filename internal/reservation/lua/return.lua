
local sale = redis.call('HMGET', KEYS[1], 'epoch', 'replid', 'since')
if not sale[1] then return 'unloaded' end
local id = replid()
if ARGV[2] ~= '' then
  -- A check of the sale (its token) puts back what Redis lost.
  if sale[2] ~= 'checking:' .. ARGV[2] then return 'moved' end
elseif string.sub(sale[2] or '', 1, 9) == 'checking:' then
  -- A check under way; one that has lasted 2 s (or was abandoned) is
  -- taken for dead, and the caller checks the sale itself.
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now - tonumber(sale[3] or '0') < 2000 then return 'checking' end
  return 'unchecked'
elseif not id or sale[2] ~= id then
  return 'unchecked'
end
if math.floor(tonumber(sale[1]) / 1048576) ~= math.floor(tonumber(ARGV[1]) / 1048576) then return 'other' end
local n = 0
if ARGV[3] == 'restock' then
  for i = 4, #ARGV, 2 do
    if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
      local q = tonumber(ARGV[i + 1])
      redis.call('HINCRBY', KEYS[1], 'available', q)
      redis.call('HINCRBY', KEYS[1], 'restocked', q)
      n = n + 1
    end
  end
  return 'OK ' .. n
end
-- Returns: id, quantity, buyer, and the units the order claimed on its
-- buyer's count (0 when taken without a limit): what the count gets back,
-- so it never falls below what the buyer's counted orders hold.
for i = 4, #ARGV, 4 do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    local q = tonumber(ARGV[i + 1])
    redis.call('HINCRBY', KEYS[1], 'available', q)
    redis.call('HINCRBY', KEYS[1], 'returned', q)
    redis.call('HINCRBY', KEYS[1], 'returns', 1)
    local c = tonumber(ARGV[i + 3])
    if c > 0 then redis.call('HINCRBY', KEYS[3], ARGV[i + 2], -c) end
    n = n + 1
  end
end
return 'OK ' .. n
