-- Leave one level of a lock, compare-and-delete style.
-- KEYS[1] lock hash; ARGV[1] owner token; ARGV[2] keep ms (0: free the key now).
-- Fair locks also pass KEYS[2] queue and KEYS[3] registrations (see fair_acquire.lua).
-- Returns -1 not the owner (nothing changed), 0 released, n > 0 still held n levels deep.
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner or owner == '' or owner ~= ARGV[1] then
  return -1
end
local depth = redis.call('HINCRBY', KEYS[1], 'depth', -1)
if depth > 0 then
  return depth
end
local keep = tonumber(ARGV[2])
if keep > 0 then
  -- hold_at_least: the key stays taken, by nobody, until the minimum hold time has passed.
  redis.call('HSET', KEYS[1], 'owner', '', 'depth', 0)
  redis.call('PEXPIRE', KEYS[1], keep)
  return 0
end
redis.call('DEL', KEYS[1])
-- Waiters subscribe to the key's own name as a channel. A fair lock's release is news to
-- its queue's head alone: the message names it, and only it wakes.
if KEYS[2] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, waiter in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
    redis.call('ZREM', KEYS[2], waiter)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)
  if head[1] then
    redis.call('PUBLISH', KEYS[1], head[1])
  end
  return 0
end
redis.call('PUBLISH', KEYS[1], '1')
return 0
