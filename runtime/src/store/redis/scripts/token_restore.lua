-- Give a consumed token back (its body failed: a retry may use it).
-- KEYS[1] token key; ARGV[1] scene; ARGV[2] owner that consumed it.
-- Returns 1 restored, 0 not consumed by this owner (nothing changed).
if redis.call('GET', KEYS[1]) ~= '!' .. ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
return 1
