-- A fair-lock waiter gives up its place. KEYS[1] lock; KEYS[2] queue; KEYS[3] registrations;
-- ARGV[1] owner. When the lock is free, the new head is told it is its turn (the lock's name
-- is the channel, the message the head's owner token).
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)
  if head[1] then
    redis.call('PUBLISH', KEYS[1], head[1])
  end
end
return 1
