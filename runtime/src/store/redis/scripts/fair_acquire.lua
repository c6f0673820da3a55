-- Acquire (or re-enter) a fair lock: a free lock goes to the longest-waiting live waiter.
-- KEYS[1] lock hash {owner, depth, fence} (same shape as an exclusive lock); KEYS[2] queue
-- zset owner -> arrival ticket; KEYS[3] zset owner -> registration end (ms, Redis time);
-- KEYS[4] fencing counter. All share one hash tag.
-- ARGV[1] owner; ARGV[2] lease ms; ARGV[3] level: 1 for an acquisition, n > 1 for the n-th
-- nested level of the owner that holds the lock; ARGV[4] counter TTL ms; ARGV[5] registration
-- ms; ARGV[6] '1' to queue up when not acquired.
-- Returns {1, fence, depth} acquired, {0, ms worth waiting, 0} not yet, {2, 0, 0} a nested
-- level whose owner no longer holds the lock, {4, 0, 0} something else is stored at the
-- counter.
-- A release hands the lock straight to the head of the queue (fair_release.lua): the lock is
-- then already the head's, with a short TTL, and this script only extends it to the lease.

-- `next_fence` is in fence.lua, loaded ahead of this script.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local level = tonumber(ARGV[3])
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= '' and owner == ARGV[1] then
  if level == 1 then
    -- Handed over while we waited (the notice may not have reached us): take it up.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(redis.call('HGET', KEYS[1], 'fence')), 1}
  end
  -- Naming the level makes the entry idempotent: sent twice, it is still one level.
  local depth = tonumber(redis.call('HGET', KEYS[1], 'depth')) or 0
  if depth < level then
    depth = level
    redis.call('HSET', KEYS[1], 'depth', depth)
  end
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, tonumber(redis.call('HGET', KEYS[1], 'fence')), depth}
end
if level > 1 then
  return {2, 0, 0}
end
if not owner then
  -- Free with nobody handed it (its holder's lease ran out, or it was never taken): the
  -- first waiter still registered takes it. Waiters that stopped retrying lose their place
  -- as they reach the head — the caller too: its own lapsed ticket at the head would take
  -- the lock ahead of waiters that kept their places.
  local mine = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[1]))
  if mine and mine <= now then
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  while head and head ~= ARGV[1] and (tonumber(redis.call('ZSCORE', KEYS[3], head)) or 0) <= now do
    redis.call('ZREM', KEYS[2], head)
    redis.call('ZREM', KEYS[3], head)
    head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  end
  if not head or head == ARGV[1] then
    if head then
      redis.call('ZREM', KEYS[2], head)
      redis.call('ZREM', KEYS[3], head)
    end
    local fence = next_fence(KEYS[4], ARGV[4], t)
    if not fence then
      return {4, 0, 0}
    end
    redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'depth', 1, 'fence', fence)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(fence), 1}
  end
end
if ARGV[6] == '1' then
  -- A place whose registration lapsed is lost (as if its waiter had left): coming back, the
  -- waiter queues at the tail. Its ticket lingered until someone dropped it or the queue
  -- expired, and handed it the lock ahead of waiters that had kept their places.
  local registered = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[1]))
  if registered and registered <= now then
    redis.call('ZREM', KEYS[2], ARGV[1])
  end
  -- Tickets follow the queue's tail; an empty queue starts again from 1.
  local tail = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  redis.call('ZADD', KEYS[2], 'NX', (tonumber(tail[2]) or 0) + 1, ARGV[1])
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[1])
  redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[5]))
  redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[5]))
end
if owner then
  return {0, math.max(redis.call('PTTL', KEYS[1]), 0), 0}
end
-- Free, but another waiter's turn: it retries within its registration time.
return {0, math.floor(tonumber(ARGV[5]) / 10), 0}
