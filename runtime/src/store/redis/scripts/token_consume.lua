-- Consume an idempotency token.
-- KEYS[1] token key; ARGV[1] scene.
-- Returns 0 consumed, 1 already used, 2 unknown, 3 issued for another scene.
local v = redis.call('GET', KEYS[1])
if not v then
  return 2
end
if v == '!used' then
  return 1
end
if v ~= ARGV[1] then
  return 3
end
-- Keep a tombstone for the rest of the token's life so a replay is told apart from a forgery.
redis.call('SET', KEYS[1], '!used', 'KEEPTTL')
return 0
