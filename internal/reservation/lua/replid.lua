
local function replid()
  local info = redis.call('INFO', 'replication')
  if not string.find(info, 'role:master', 1, true) then return false end
  return string.match(info, 'master_replid:(%w+)')
end
