-- lock_acquire.lua's free path without the fencing counter: the hash, its lease, no fence.
local all = redis.call('HGETALL', KEYS[1])
if #all > 0 then
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'depth', 1, 'fence', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, 1, 1}
