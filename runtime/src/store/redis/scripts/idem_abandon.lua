-- Undo a begin whose outcome the caller does not know (it timed out, or its caller gave up
-- before the body ran): the record it may have written goes, so a retry can run.
-- KEYS[1] record; ARGV[1] owner.
-- Returns 1 removed, 0 not this owner's PROCESSING record (nothing changed).
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner', 'w')
if rec[1] ~= 'P' or rec[2] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
-- The waiting duplicates may begin it themselves now (see idem_begin.lua).
if rec[3] then
  redis.call('PUBLISH', KEYS[1], '1')
end
return 1
