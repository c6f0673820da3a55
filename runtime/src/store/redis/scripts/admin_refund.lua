-- Give back units charged to a rate limit (redguard::admin refund), in the state formats of
-- rate_check.lua (see there).
-- KEYS[1] the limit's state key; ARGV[1] units.
-- Returns the units given back: at most what is charged; a sliding log gives back whole
-- calls, newest first, while their costs fit in the units.
local units = tonumber(ARGV[1])
local key = KEYS[1]
local ty = redis.call('TYPE', key).ok
if ty == 'none' then
  return 0
end
local function corrupt(detail)
  return redis.error_reply('CORRUPT ' .. key .. ' ' .. detail)
end
local function int(x)
  return string.format('%.0f', x)
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ty == 'string' then
  -- GCRA: the debt (TAT - now) in the state's unit, relative to the current millisecond.
  local v = redis.call('GET', key)
  local at = pexpiretime(key)
  local fine = string.match(v, '^%-(%d%d%d%d%d%d%d+)$')
  local T, debt, per_ms
  if fine then
    fine = tonumber(fine)
    T, per_ms = math.floor(fine / 1000000), 1000000
    debt = (at - now_ms) * per_ms - fine % 1000000
  else
    local t_digits, r = string.match(v, '^(%d+)(%d%d%d)$')
    if t_digits then
      T, per_ms = tonumber(t_digits), 1000
      debt = (at - now_ms) * per_ms - tonumber(r)
    else
      local tat, old_t = string.match(v, '^(%d+):(%d+)$')
      if not tat then
        return corrupt('a string that is not a gcra state')
      end
      -- The format before 0.1: an absolute TAT in µs, the TTL kept as it is.
      local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
      tat, old_t = tonumber(tat), tonumber(old_t)
      if old_t <= 0 or tat <= now_us then
        return 0
      end
      local back = math.min(units, math.ceil((tat - now_us) / old_t))
      redis.call('SET', key, int(tat - back * old_t) .. ':' .. int(old_t), 'KEEPTTL')
      return back
    end
  end
  if T <= 0 or debt <= 0 then
    return 0
  end
  local back = math.min(units, math.ceil(debt / T))
  local left = debt - back * T
  if left <= 0 then
    redis.call('DEL', key)
    return back
  end
  local up = math.ceil(left / per_ms)
  if per_ms == 1000000 then
    redis.call('SET', key, int(-(T * 1000000 + up * 1000000 - left)), 'PXAT', int(now_ms + up))
  else
    redis.call('SET', key, int(T) .. string.format('%03d', up * 1000 - left), 'PXAT',
      int(now_ms + up))
  end
  return back
elseif ty == 'hash' then
  local a = redis.call('HGET', key, 'a')
  local field = ({ fw = 'n', sc = 'c', tb = 'v', lb = 'v' })[a or '']
  if not field then
    return corrupt('a hash without a known algorithm tag')
  end
  local level = tonumber(redis.call('HGET', key, field))
  if not level then
    return corrupt('field ' .. field .. ' of a ' .. a .. ' state is not a number')
  end
  local back = math.min(units, math.ceil(level))
  redis.call('HSET', key, field, string.format('%.17g', math.max(level - back, 0)))
  return back
elseif ty == 'zset' then
  local back = 0
  -- Bounded by the log's size (at most the maximum count of a sliding window).
  while true do
    local newest = redis.call('ZRANGE', key, -1, -1)[1]
    if not newest then
      break
    end
    local cost = tonumber(string.match(newest, '^%d+:(%d+)$'))
    if not cost then
      return corrupt('a sliding-log entry of another format')
    end
    if back + cost > units then
      break
    end
    redis.call('ZREM', key, newest)
    back = back + cost
  end
  return back
end
return corrupt('a ' .. ty .. ' is stored there')
