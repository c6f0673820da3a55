-- One key per resource that outlives its holders: `<fence>:<depth>:<owner>` while held,
-- `<fence>::` when free (kept with the counter's TTL, so no second key is read or written).
local v = redis.call('GET', KEYS[1])
local last = 0
if v then
  local fence, owner = string.match(v, '^(%d+):%d*:(.*)$')
  if owner ~= '' then
    return {0, redis.call('PTTL', KEYS[1]), 0}
  end
  last = tonumber(fence)
end
local t = redis.call('TIME')
local fence = string.format('%.0f', math.max(last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2])))
redis.call('SET', KEYS[1], fence .. ':1:' .. ARGV[1], 'PX', ARGV[2])
return {1, tonumber(fence), 1}
