-- Acquire (or re-enter) a fair lock: free locks go to the longest-waiting live waiter.
-- KEYS[1] lock hash {owner, depth, fence} (same shape as an exclusive lock); KEYS[2] queue
-- zset owner -> arrival ticket; KEYS[3] zset owner -> registration end (ms, Redis time);
-- KEYS[4] fencing counter; KEYS[5] ticket counter. All share one hash tag.
-- ARGV[1] owner; ARGV[2] lease ms; ARGV[3] max depth; ARGV[4] counter TTL ms;
-- ARGV[5] registration ms; ARGV[6] '1' to queue up when not acquired.
-- Returns {1, fence, depth} acquired, {0, ms worth waiting, 0} not yet, {2, 0, depth} too deep.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Waiters that stopped retrying (gave up, crashed) lose their place.
local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, waiter in ipairs(stale) do
  redis.call('ZREM', KEYS[2], waiter)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= '' and owner == ARGV[1] then
  local depth = tonumber(redis.call('HGET', KEYS[1], 'depth')) or 0
  if depth >= tonumber(ARGV[3]) then
    return {2, 0, depth}
  end
  depth = redis.call('HINCRBY', KEYS[1], 'depth', 1)
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, tonumber(redis.call('HGET', KEYS[1], 'fence')), depth}
end
if not owner then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #head == 0 or head[1] == ARGV[1] then
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
    local fence = redis.call('INCR', KEYS[4])
    if fence == 1 then
      fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
      redis.call('SET', KEYS[4], string.format('%.0f', fence))
    end
    redis.call('PEXPIRE', KEYS[4], ARGV[4])
    redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'depth', 1, 'fence', string.format('%.0f', fence))
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, fence, 1}
  end
end
if ARGV[6] == '1' then
  if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
    local ticket = redis.call('INCR', KEYS[5])
    redis.call('PEXPIRE', KEYS[5], ARGV[4])
    redis.call('ZADD', KEYS[2], ticket, ARGV[1])
  end
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[1])
  redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[5]))
  redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[5]))
end
if owner then
  return {0, math.max(redis.call('PTTL', KEYS[1]), 0), 0}
end
-- Free, but another waiter's turn: it retries within its registration time.
return {0, math.floor(tonumber(ARGV[5]) / 10), 0}
