-- A fair-lock waiter gives up its place. KEYS[2] queue; KEYS[3] registrations; ARGV[1] owner.
-- KEYS[1] is the lock (its name is the channel): waiters behind are told the head moved.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('PUBLISH', KEYS[1], '1')
return 1
