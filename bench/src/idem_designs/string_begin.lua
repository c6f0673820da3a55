-- The record as one string `<status>|<owner>|<fingerprint>|<started s>` written with one
-- SET PX: idem_begin.lua's free path without a hash (no EXISTS, no HSET of four fields, no
-- PEXPIRE).
if redis.call('GET', KEYS[1]) then
  return {2}
end
local t = redis.call('TIME')
redis.call('SET', KEYS[1], 'P|' .. ARGV[1] .. '|' .. ARGV[2] .. '|' .. t[1], 'PX', ARGV[3])
return {0}
