-- Acquire (or re-enter) a lock.
-- KEYS[1] lock hash {owner, depth, fence}; KEYS[2] fencing counter (same hash tag).
-- ARGV[1] owner token; ARGV[2] lease ms; ARGV[3] max depth; ARGV[4] counter TTL ms.
-- Returns {1, fence, depth} acquired, {0, pttl, 0} held by another, {2, 0, depth} too deep,
-- {3, 0, 0} the lock hash is not one this script wrote, {4, 0, 0} neither is the counter.
local h = redis.call('HMGET', KEYS[1], 'owner', 'depth', 'fence')
local owner = h[1]
if not owner then
  -- Something else sits at our key (a hash without an owner): never take it over silently.
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return {3, 0, 0}
  end
  -- INCR refuses anything but an integer at the counter (another type, or text); a
  -- negative one yields no valid token either. Other refusals (out of memory) pass on.
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' then
    if string.find(fence.err, 'WRONGTYPE', 1, true) or string.find(fence.err, 'not an integer', 1, true) then
      return {4, 0, 0}
    end
    return fence
  end
  if fence < 1 then
    return {4, 0, 0}
  end
  if fence == 1 then
    -- The counter expired (or never existed): restart from Redis's clock in microseconds, so
    -- tokens keep increasing across the gap. Below 2^53, exact in Lua's doubles.
    local t = redis.call('TIME')
    fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', KEYS[2], string.format('%.0f', fence))
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'depth', 1, 'fence', string.format('%.0f', fence))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence, 1}
end
if not tonumber(h[2]) or not tonumber(h[3]) then
  return {3, 0, 0}
end
if owner ~= '' and owner == ARGV[1] then
  local depth = tonumber(redis.call('HGET', KEYS[1], 'depth')) or 0
  if depth >= tonumber(ARGV[3]) then
    return {2, 0, depth}
  end
  depth = redis.call('HINCRBY', KEYS[1], 'depth', 1)
  -- A nested entry may extend the lease, never shorten the outer level's.
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, tonumber(redis.call('HGET', KEYS[1], 'fence')), depth}
end
return {0, redis.call('PTTL', KEYS[1]), 0}
