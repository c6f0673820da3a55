-- Leave a read/write lock held in read mode.
-- KEYS[1] writer hash (its name is the channel waiters listen on); KEYS[2] readers zset.
-- ARGV[1] owner. Returns 1 released (waiters notified), 0 not a reader, or its lease ran
-- out (nothing else changed).
-- A holder whose lease ran out lost its slot, whether or not anyone has dropped it yet: it
-- is told so (as a lock's holder is), rather than "released".
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[2])
end
redis.call('PUBLISH', KEYS[1], '1')
return 1
