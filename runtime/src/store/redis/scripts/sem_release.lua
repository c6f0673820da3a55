-- Give a semaphore slot back. KEYS[1] zset; ARGV[1] owner.
-- Returns 1 released (waiters notified), 0 the owner had no slot, or
-- its lease ran out (nothing else changed).
-- A holder whose lease ran out lost its slot, whether or not anyone has dropped it yet: it
-- is told so (as a lock's holder is), rather than "released".
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', KEYS[1], '1')
return 1
