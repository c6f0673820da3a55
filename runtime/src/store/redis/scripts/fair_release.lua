-- Leave a fair lock, or give up a place in its queue; a free lock is handed to the head.
-- KEYS[1] lock hash; KEYS[2] queue; KEYS[3] registrations; KEYS[4] fencing counter
-- (see fair_acquire.lua). ARGV[1] owner; ARGV[2] keep ms (0: free the key now); ARGV[3] '1'
-- when a waiter gives up its place; ARGV[4] counter TTL ms; ARGV[5] registration ms.
-- Returns -1 not the owner (nothing of the lock changed), 0 released, n > 0 still held n
-- levels deep.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local leaving = ARGV[3] == '1'
if leaving then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
local code = -1
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= '' and owner == ARGV[1] then
  -- A waiter giving up may have been handed the lock meanwhile: it passes it on whole.
  local depth = leaving and 0 or redis.call('HINCRBY', KEYS[1], 'depth', -1)
  if depth > 0 then
    return depth
  end
  code = 0
  if tonumber(ARGV[2]) > 0 then
    -- hold_at_least: the key stays taken, by nobody, until the minimum hold time has passed.
    redis.call('HSET', KEYS[1], 'owner', '', 'depth', 0)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
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
    local fence = redis.call('INCR', KEYS[4])
    if fence == 1 then
      fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
      redis.call('SET', KEYS[4], string.format('%.0f', fence))
    end
    redis.call('PEXPIRE', KEYS[4], ARGV[4])
    fence = string.format('%.0f', fence)
    redis.call('HSET', KEYS[1], 'owner', head, 'depth', 1, 'fence', fence)
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
    redis.call('PUBLISH', KEYS[1], head .. ' ' .. fence)
    break
  end
end
return code
