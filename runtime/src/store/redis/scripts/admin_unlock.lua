-- Forced release of a lock by an operator (redguard::admin unlock): frees it whoever holds
-- it, and raises its fencing counter so every token handed out before is stale.
-- KEYS[1] the lock (hash {owner, depth, fence}, or a semaphore's zset owner -> lease end);
-- KEYS[2] its fencing counter; KEYS[3] (read/write locks only) the readers' zset.
-- ARGV[1] 'h' for a hash, 'z' for a semaphore; ARGV[2] only this owner ('' = every holder);
-- ARGV[3] counter TTL ms.
-- Returns {removed, fence}: {0, 0} when nothing was held (nothing changed), {-1, 0} when
-- something else is stored at the counter.

-- `next_fence` is in fence.lua, loaded ahead of this script.
local function drop_set(key)
  if ARGV[2] == '' then
    local n = redis.call('ZCARD', key)
    redis.call('DEL', key)
    return n
  end
  return redis.call('ZREM', key, ARGV[2])
end
local removed = 0
if ARGV[1] == 'z' then
  removed = drop_set(KEYS[1])
else
  -- An owner of '' is a lock kept for hold_at_least: freed by a release of every holder.
  local owner = redis.call('HGET', KEYS[1], 'owner')
  if owner and (ARGV[2] == '' or owner == ARGV[2]) then
    redis.call('DEL', KEYS[1])
    removed = 1
  end
  if KEYS[3] then
    removed = removed + drop_set(KEYS[3])
  end
end
if removed == 0 then
  return {0, 0}
end
local fence = next_fence(KEYS[2], ARGV[3])
if not fence then
  return {-1, 0}
end
-- Waiters subscribe to the lock's own name.
redis.call('PUBLISH', KEYS[1], '1')
return {removed, tonumber(fence)}
