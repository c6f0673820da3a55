-- Give a semaphore slot back. KEYS[1] zset; ARGV[1] owner.
-- Returns 1 released (waiters notified), 0 the owner had no slot (nothing changed).
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', KEYS[1], '1')
return 1
