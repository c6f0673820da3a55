-- Adds an instance's counts to a rate-limit tally (rate/top.rs): a sorted set of one scope,
-- outcome and minute, key -> calls.
-- KEYS[1] the tally; ARGV[1] TTL ms; ARGV[2] the most members kept; ARGV[3..] key, count pairs.
-- Only the highest `max` members stay (the lowest are dropped, as a heavy-hitters sketch
-- drops its smallest counters), so its memory is bounded whatever the number of keys.
for i = 3, #ARGV, 2 do
  redis.call('ZINCRBY', KEYS[1], ARGV[i + 1], ARGV[i])
end
local max = tonumber(ARGV[2])
local n = redis.call('ZCARD', KEYS[1])
if n > max then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - max - 1)
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
