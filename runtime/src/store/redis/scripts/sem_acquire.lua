-- Take one slot of a semaphore.
-- KEYS[1] zset owner -> lease end (ms, Redis time); KEYS[2] fencing counter (same hash tag).
-- ARGV[1] owner; ARGV[2] permits; ARGV[3] lease ms; ARGV[4] counter TTL ms.
-- Returns {1, fence, 1} acquired, {0, ms until the earliest lease ends, 0} full, {4, 0, 0}
-- something else is stored at the counter.

-- `next_fence` is in fence.lua, loaded ahead of this script.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, math.max(tonumber(first[2]) - now, 0), 0}
end
local fence = next_fence(KEYS[2], ARGV[4], t)
if not fence then
  return {4, 0, 0}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
-- The set lives as long as its longest lease.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], math.max(tonumber(last[2]) - now, 1))
return {1, tonumber(fence), 1}
