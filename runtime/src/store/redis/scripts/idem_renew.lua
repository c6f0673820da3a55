-- Keep a PROCESSING record alive while its execution runs.
-- KEYS[1] record; ARGV[1] owner, ARGV[2] ttl ms.
-- Returns 1 renewed, 0 not this owner's PROCESSING record any more (nothing changed).
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner')
if rec[1] ~= 'P' or rec[2] ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
