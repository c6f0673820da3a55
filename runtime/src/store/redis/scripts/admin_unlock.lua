-- Forced release of a lock by an operator (redguard::admin unlock): frees the holders the
-- operator read, and raises its fencing counter so every token handed out before is stale.
-- A holder that took the lock after the operator's read is not among them and is left alone.
-- KEYS[1] the lock (hash {owner, depth, fence}, or a semaphore's zset owner -> lease end);
-- KEYS[2] its fencing counter; KEYS[3] (read/write locks only) the readers' zset.
-- ARGV[1] 'h' for a hash, 'z' for a semaphore; ARGV[2] counter TTL ms; ARGV[3..] the owners
-- to free ('' is a lock kept for hold_at_least).
-- Returns {removed, fence}: {0, 0} when nothing was held (nothing changed), {-1, 0} when
-- something else is stored at the counter.

-- `next_fence` is in fence.lua, loaded ahead of this script.
local owners = {}
for i = 3, #ARGV do
  owners[ARGV[i]] = true
end
local function drop_set(key)
  local n = 0
  for i = 3, #ARGV do
    n = n + redis.call('ZREM', key, ARGV[i])
  end
  return n
end
local removed = 0
if ARGV[1] == 'z' then
  removed = drop_set(KEYS[1])
else
  local owner = redis.call('HGET', KEYS[1], 'owner')
  if owner and owners[owner] then
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
local fence = next_fence(KEYS[2], ARGV[2])
if not fence then
  return {-1, 0}
end
-- Waiters subscribe to the lock's own name.
redis.call('PUBLISH', KEYS[1], '1')
return {removed, tonumber(fence)}
