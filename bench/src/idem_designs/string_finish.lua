-- idem_finish.lua on the one-string record: `<status>|<owner>|<finished s>|<result>`.
local v = redis.call('GET', KEYS[1])
local mine = 'P|' .. ARGV[1] .. '|'
if not v or string.sub(v, 1, #mine) ~= mine then
  return 0
end
local t = redis.call('TIME')
redis.call('SET', KEYS[1], ARGV[2] .. '|' .. ARGV[1] .. '|' .. t[1] .. '|' .. ARGV[3], 'PX', ARGV[4])
return 1
