-- Finish the execution that ARGV[1] began.
-- KEYS[1] record; ARGV[1] owner, ARGV[2] 'S', 'F' or 'U', ARGV[3] result, ARGV[4] ttl ms.
-- Returns 1 recorded, 0 not this owner's record any more (expired or taken over).
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner', 'w')
if rec[1] ~= 'P' or rec[2] ~= ARGV[1] then
  return 0
end
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
if ARGV[2] == 'S' then
  redis.call('HSET', KEYS[1], 'status', 'S', 'result', ARGV[3], 'finished', now_ms)
else
  redis.call('HSET', KEYS[1], 'status', ARGV[2], 'finished', now_ms)
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
-- Duplicates that found it in progress wait on the record's name (see idem_begin.lua); an
-- execution nobody waited for publishes nothing.
if rec[3] then
  redis.call('HDEL', KEYS[1], 'w')
  redis.call('PUBLISH', KEYS[1], '1')
end
return 1
