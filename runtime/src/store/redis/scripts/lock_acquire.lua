-- Acquire a lock, or enter one more level of it.
-- KEYS[1] lock hash {owner, depth, fence, w}; KEYS[2] fencing counter (same hash tag).
-- ARGV[1] owner token; ARGV[2] lease ms; ARGV[3] level: 1 for an acquisition, n > 1 for the
-- n-th nested level of the owner that holds the lock; ARGV[4] counter TTL ms; ARGV[5] '1'
-- when the caller waits for a release if the lock is held: the hash then gets `w`, and only
-- the release of a hash with `w` publishes (a release nobody waits for skips PUBLISH).
-- Returns {1, fence, depth} acquired, {0, pttl, 0} held by another, {2, 0, 0} a nested level
-- whose owner no longer holds the lock, {3, 0, 0} the lock hash is not one this script wrote,
-- {4, 0, 0} neither is the counter.

-- `next_fence` is in fence.lua, loaded ahead of this script.
-- One read whether the key is free (the hot path: nothing there) or held.
local all = redis.call('HGETALL', KEYS[1])
local level = tonumber(ARGV[3])
if #all == 0 then
  if level > 1 then
    return {2, 0, 0}
  end
  local fence = next_fence(KEYS[2], ARGV[4])
  if not fence then
    return {4, 0, 0}
  end
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'depth', 1, 'fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(fence), 1}
end
local h = {}
for i = 1, #all, 2 do
  h[all[i]] = all[i + 1]
end
local owner = h.owner
local depth = tonumber(h.depth)
-- Something else sits at our key (a hash without an owner): never take it over silently.
if not owner or not depth or not tonumber(h.fence) then
  return {3, 0, 0}
end
if owner ~= '' and owner == ARGV[1] then
  -- Naming the level makes the entry idempotent: sent twice, it is still one level.
  if depth < level then
    depth = level
    redis.call('HSET', KEYS[1], 'depth', depth)
  end
  -- A nested entry may extend the lease, never shorten the outer level's.
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, tonumber(h.fence), depth}
end
if level > 1 then
  return {2, 0, 0}
end
if ARGV[5] == '1' and not h.w then
  redis.call('HSET', KEYS[1], 'w', 1)
end
return {0, redis.call('PTTL', KEYS[1]), 0}
