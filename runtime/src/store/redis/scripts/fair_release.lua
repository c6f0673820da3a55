-- Leave a fair lock, or give up a place in its queue; a free lock is handed to the head.
-- KEYS[1] lock hash; KEYS[2] queue; KEYS[3] registrations; KEYS[4] fencing counter
-- (see fair_acquire.lua). ARGV[1] owner; ARGV[2] the level left (1: the lock itself; as in
-- lock_release.lua, leaving a level twice changes nothing); ARGV[3] keep ms (0: free the key
-- now); ARGV[4] '1' when a waiter gives up its place; ARGV[5] counter TTL ms; ARGV[6]
-- registration ms.
-- Returns -1 not the owner (nothing of the lock changed), 0 released, n > 0 still held n
-- levels deep.

-- `next_fence` is in fence.lua, loaded ahead of this script.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local leaving = ARGV[4] == '1'
if leaving then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
local code = -1
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= '' and owner == ARGV[1] then
  local level = tonumber(ARGV[2])
  if level > 1 and not leaving then
    local depth = tonumber(redis.call('HGET', KEYS[1], 'depth')) or 1
    if depth >= level then
      depth = level - 1
      redis.call('HSET', KEYS[1], 'depth', depth)
    end
    return depth
  end
  -- A waiter giving up may have been handed the lock meanwhile: it passes it on whole.
  code = 0
  if tonumber(ARGV[3]) > 0 and not leaving then
    -- hold_at_least: the key stays taken, by nobody, until the minimum hold time has passed.
    redis.call('HSET', KEYS[1], 'owner', '', 'depth', 0)
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return code
  end
  redis.call('DEL', KEYS[1])
elseif owner then
  return code
end
-- Free: hand it to the first waiter still registered, for as long as a registration lasts
-- (it extends that to its lease at once; a waiter that died meanwhile blocks no longer), and
-- tell it on the lock's channel, naming it and its fencing token. Nobody else is woken.
while true do
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not head then
    break
  end
  local registered = tonumber(redis.call('ZSCORE', KEYS[3], head)) or 0
  redis.call('ZREM', KEYS[2], head)
  redis.call('ZREM', KEYS[3], head)
  if registered > now then
    local fence = next_fence(KEYS[4], ARGV[5], t)
    if not fence then
      return redis.error_reply('CORRUPT ' .. KEYS[4] .. ' the fencing counter is not a number')
    end
    redis.call('HSET', KEYS[1], 'owner', head, 'depth', 1, 'fence', fence)
    redis.call('PEXPIRE', KEYS[1], ARGV[6])
    redis.call('PUBLISH', KEYS[1], head .. ' ' .. fence)
    break
  end
end
return code
