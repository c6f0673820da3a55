-- Extend a lock's lease if the caller still owns it.
-- KEYS[1] lock hash; ARGV[1] owner token; ARGV[2] lease ms.
-- Returns 1 extended, 0 lost (absent or another owner; nothing changed).
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= '' and owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
