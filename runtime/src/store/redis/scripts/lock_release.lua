-- Leave a level of a lock, compare-and-delete style.
-- KEYS[1] lock hash; ARGV[1] owner token; ARGV[2] the level left (1: the lock itself);
-- ARGV[3] keep ms (0: free the key now).
-- Returns -1 not the owner (nothing changed), 0 released, n > 0 still held n levels deep.
-- Leaving a level leaves every level above it too, and leaving it again changes nothing: a
-- release sent twice (its caller gave up waiting for the reply) never leaves an outer level.
local h = redis.call('HMGET', KEYS[1], 'owner', 'depth', 'w')
local owner = h[1]
if not owner or owner == '' or owner ~= ARGV[1] then
  return -1
end
local level = tonumber(ARGV[2])
if level > 1 then
  local depth = tonumber(h[2]) or 1
  if depth >= level then
    depth = level - 1
    redis.call('HSET', KEYS[1], 'depth', depth)
  end
  return depth
end
local keep = tonumber(ARGV[3])
if keep > 0 then
  -- hold_at_least: the key stays taken, by nobody, until the minimum hold time has passed.
  redis.call('HSET', KEYS[1], 'owner', '', 'depth', 0)
  redis.call('PEXPIRE', KEYS[1], keep)
  return 0
end
redis.call('DEL', KEYS[1])
-- Waiters subscribe to the key's own name as a channel; one that found the lock held marked
-- the hash (`w`, see lock_acquire.lua), so a release nobody waits for publishes nothing.
if h[3] then
  redis.call('PUBLISH', KEYS[1], '1')
end
return 0
