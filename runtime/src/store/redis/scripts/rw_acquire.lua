-- Take a read/write lock in read or write mode.
-- KEYS[1] writer hash {owner, depth, fence} (same shape as an exclusive lock);
-- KEYS[2] readers zset owner -> lease end (ms, Redis time); KEYS[3] writer intent;
-- KEYS[4] fencing counter. All share one hash tag.
-- ARGV[1] owner; ARGV[2] 'W' (write, announcing a wait), 'w' (write, no wait) or 'r'; ARGV[3] lease ms; ARGV[4] counter TTL ms; ARGV[5] intent ms.
-- Returns {1, fence, 1} acquired, {0, ms worth waiting, 0} held, {4, 0, 0} something else is
-- stored at the counter.

-- `next_fence` is in fence.lua, loaded ahead of this script.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, math.max(redis.call('PTTL', KEYS[1]), 0), 0}
end
local intent = redis.call('GET', KEYS[3])
if ARGV[2] ~= 'r' then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if #first > 0 then
    -- Announce the waiting writer: new readers queue behind it instead of starving it.
    if ARGV[2] == 'W' and (not intent or intent == ARGV[1]) then
      redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[5])
    end
    return {0, math.max(tonumber(first[2]) - now, 0), 0}
  end
  if intent and intent ~= ARGV[1] then
    return {0, math.max(redis.call('PTTL', KEYS[3]), 0), 0}
  end
  redis.call('DEL', KEYS[3])
  local fence = next_fence(KEYS[4], ARGV[4], t)
  if not fence then
    return {4, 0, 0}
  end
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'depth', 1, 'fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, tonumber(fence), 1}
end
if intent then
  return {0, math.max(redis.call('PTTL', KEYS[3]), 0), 0}
end
local fence = next_fence(KEYS[4], ARGV[4], t)
if not fence then
  return {4, 0, 0}
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(last[2]) - now, 1))
return {1, tonumber(fence), 1}
