-- Consume an idempotency token.
-- KEYS[1] token key; ARGV[1] scene; ARGV[2] owner (the execution consuming it).
-- Returns 0 consumed, 1 already used, 2 unknown, 3 issued for another scene.
local v = redis.call('GET', KEYS[1])
if not v then
  return 2
end
if string.sub(v, 1, 1) == '!' then
  return 1
end
if v ~= ARGV[1] then
  return 3
end
-- Keep a tombstone naming the consumer for the rest of the token's life, so a replay is told
-- apart from a forgery, and only the consumer can give the token back.
redis.call('SET', KEYS[1], '!' .. ARGV[2], 'KEEPTTL')
return 0
