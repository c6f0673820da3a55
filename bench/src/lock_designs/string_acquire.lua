-- The lock as one string `<fence>:<depth>:<owner>`, written with one SET PX; the fencing
-- counter kept in its own key as today (GET, TIME, SET PX).
if redis.call('GET', KEYS[1]) then
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local t = redis.call('TIME')
local fence = string.format('%.0f', math.max(last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2])))
redis.call('SET', KEYS[2], fence, 'PX', ARGV[4])
redis.call('SET', KEYS[1], fence .. ':1:' .. ARGV[1], 'PX', ARGV[2])
return {1, tonumber(fence), 1}
