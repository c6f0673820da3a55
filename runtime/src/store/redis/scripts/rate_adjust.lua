-- Charge units to a rate limit, or give them back, after the call (redguard::rate::Charge):
-- no decision, in the state formats and the arithmetic of rate_check.lua (see there, also
-- for exactness), so a cost charged after the call leaves the state a cost charged up front
-- leaves. A charge always lands, past the limit too: the balance goes negative (a debt
-- beyond the burst, a window's count above its limit) and the next check waits it out.
-- KEYS[1] the limit's state key, KEYS[2] its quota override (quota.lua); KEYS[3], off a
-- Cluster, the handle's prefix-override hash (quota.lua's prefixes()).
-- ARGV[1] 'c' to charge, 'r' to give back; ARGV[2] units (1 to 1e9); ARGV[3] algorithm;
-- ARGV[4] interval_ns, ARGV[5] period_us, ARGV[6] burst or count (the code's; an override
-- replaces them as in rate_check.lua).
-- Returns { units charged or given back, the override's state: 0 none or applied, -1 one
-- that is not an override (ignored) }.
local key = KEYS[1]
local charge = ARGV[1] == 'c'
local units = tonumber(ARGV[2])
local algo = ARGV[3]
local interval = tonumber(ARGV[4])
local period = tonumber(ARGV[5])
local burst = tonumber(ARGV[6])
local window = algo == 'fixed_window' or algo == 'sliding_window' or algo == 'sliding_counter'
local q = 0
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if KEYS[3] then prefixes(KEYS[3]) end
local qi, qp, qc, qb = quota(KEYS[2], key, now)
if qi == false or (qi and algo == 'sliding_window' and qc > 10000) then
  q = -1
elseif qi then
  interval, period = qi, qp
  if window then burst = qc else burst = qb end
end

local function int(x) return string.format('%.0f', x) end
local function num(x) return string.format('%.17g', x) end
local function ms(us)
  local v = math.ceil(us / 1000)
  if v < 1 then v = 1 end
  return int(v)
end
local function corrupt(detail)
  return redis.error_reply('CORRUPT ' .. key .. ' ' .. detail)
end
-- The most a debt grows to (rate_check.lua's cap): beyond any burst, every number exact.
local CAP = 4503599627370496

local ty = redis.call('TYPE', key).ok
-- A hash's fields, when the key holds one.
local s = {}
if ty == 'hash' then
  local h = redis.call('HGETALL', key)
  for j = 1, #h, 2 do s[h[j]] = h[j + 1] end
end
-- Another algorithm's state (a configuration change) is replaced by a charge, as a check's
-- commit replaces it, and holds nothing to give back.
local function mine(tag)
  return ty == 'hash' and s.a == tag
end
local function clear_foreign(own_type, tag)
  if ty ~= 'none' and not (ty == own_type and (tag == nil or s.a == tag)) then
    redis.call('UNLINK', key)
  end
end

if algo == 'gcra' or algo == 'token_bucket' or algo == 'leaky_bucket' then
  local fine = interval % 1000 ~= 0
  local unit_t = fine and interval or interval / 1000
  local per_us = fine and 1000 or 1
  local debt = 0
  local tag = nil
  if algo ~= 'gcra' then tag = algo == 'token_bucket' and 'tb' or 'lb' end
  if algo == 'gcra' and ty == 'string' then
    local v = redis.call('GET', key)
    local d, old_t, old_fine
    local n = string.match(v, '^%-(%d%d%d%d%d%d%d+)$')
    if n then
      n = tonumber(n)
      old_t, old_fine = math.floor(n / 1000000), true
      d = (pexpiretime(key) * 1000 - now) * 1000 - n % 1000000
    else
      local t_digits, r = string.match(v, '^(%d+)(%d%d%d)$')
      if t_digits then
        old_t = tonumber(t_digits)
        d = pexpiretime(key) * 1000 - tonumber(r) - now
      else
        local a
        a, old_t = string.match(v, '^(%d+):(%d+)$')
        if not a then return corrupt('a string that is not a gcra state') end
        old_t, d = tonumber(old_t), tonumber(a) - now
      end
      old_fine = false
    end
    if old_t > 0 and d > 0 then
      if old_fine == fine and old_t == unit_t then
        debt = d
      else
        debt = math.min(rescale(d, unit_t, old_t), CAP)
      end
    end
  elseif tag and mine(tag) then
    local v, u, old = tonumber(s.v), tonumber(s.u), tonumber(s.t)
    if not (v and u) then return corrupt('a ' .. tag .. ' state whose level is not a number') end
    local old_fine, old_t = fine, unit_t
    if old then
      old_fine = old % 1000 ~= 0
      old_t = old_fine and old or old / 1000
    end
    local d = v * old_t
    if old then d = math.floor(d + 0.5) else d = math.ceil(d) end
    d = d - (now - u) * (old_fine and 1000 or 1)
    if d > 0 then
      if old == interval then
        debt = d
      else
        debt = math.min(rescale(d, unit_t, old_t), CAP)
      end
    end
  end
  local new, done
  if charge then
    new, done = math.min(debt + units * unit_t, CAP), units
  else
    done = math.min(units, math.ceil(debt / unit_t))
    if done <= 0 then return { 0, q } end
    new = math.max(debt - done * unit_t, 0)
  end
  if algo == 'gcra' then
    clear_foreign('string', nil)
    if new <= 0 then
      redis.call('DEL', key)
      return { done, q }
    end
    local ms_now = math.floor(now / 1000)
    if fine then
      local x = (now - ms_now * 1000) * 1000 + new
      local up = math.ceil(x / 1000000)
      redis.call('SET', key, int(-(interval * 1000000 + up * 1000000 - x)), 'PXAT', int(ms_now + up))
    else
      local x = now - ms_now * 1000 + new
      local up = math.ceil(x / 1000)
      redis.call('SET', key, int(unit_t) .. string.format('%03d', up * 1000 - x), 'PXAT',
        int(ms_now + up))
    end
  else
    clear_foreign('hash', tag)
    if new <= 0 then
      redis.call('DEL', key)
      return { done, q }
    end
    redis.call('HSET', key, 'a', tag, 'v', num(new / unit_t), 'u', int(now), 't', int(interval))
    redis.call('PEXPIRE', key, ms(math.ceil(new / per_us)))
  end
  return { done, q }
elseif algo == 'fixed_window' or algo == 'sliding_counter' then
  local tag = algo == 'fixed_window' and 'fw' or 'sc'
  local win = math.floor(now / period)
  local cur, prev = 0, 0
  if mine(tag) then
    local w = tonumber(s.w)
    local field = tag == 'fw' and s.n or s.c
    if not (w and tonumber(field)) then return corrupt('a ' .. tag .. ' state that is not numbers') end
    if w == win then
      cur, prev = tonumber(field), tonumber(s.p) or 0
    elseif tag == 'sc' and w == win - 1 then
      prev = tonumber(field)
    end
  end
  local done
  if charge then
    cur, done = cur + units, units
  else
    -- This window's units first: they weigh fully in a sliding counter's estimate.
    local from_cur = math.min(units, cur)
    local from_prev = 0
    if tag == 'sc' then from_prev = math.min(units - from_cur, prev) end
    done = from_cur + from_prev
    if done <= 0 then return { 0, q } end
    cur, prev = cur - from_cur, prev - from_prev
  end
  clear_foreign('hash', tag)
  if tag == 'fw' then
    redis.call('HSET', key, 'a', 'fw', 'w', int(win), 'n', int(cur))
    redis.call('PEXPIRE', key, ms((win + 1) * period - now))
  else
    redis.call('HSET', key, 'a', 'sc', 'w', int(win), 'c', int(cur), 'p', int(prev))
    redis.call('PEXPIRE', key, ms((win + 2) * period - now))
  end
  return { done, q }
elseif algo == 'sliding_window' then
  -- rate_check.lua's log: one "<cum>:<cost>" member per entry, scored by its time.
  local lo = now - period
  if ty ~= 'zset' then
    if not charge then return { 0, q } end
    if ty ~= 'none' then redis.call('UNLINK', key) end
  else
    -- Entries that left the window, at most 16 per call as a check trims them.
    local stale = redis.call('ZCOUNT', key, '-inf', int(lo))
    if stale > 0 then redis.call('ZREMRANGEBYRANK', key, 0, math.min(stale, 16) - 1) end
  end
  local function newest()
    local e = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if not e[1] or tonumber(e[2]) <= lo then return nil end
    local c, k = string.match(e[1], '^(%d+):(%d+)$')
    if not c then return false end
    return e[1], tonumber(e[2]), tonumber(c), tonumber(k)
  end
  local done = 0
  if charge then
    local m, at, c, k = newest()
    if m == false then return corrupt('a sliding-log entry of another format') end
    -- Into the newest entry when it is not older than now or the window already holds a
    -- count of entries (so charges never grow the log past that bound); else an entry of
    -- its own at now, in the window for a whole period as an admission's is.
    local full = m and redis.call('ZCOUNT', key, '(' .. int(lo), '+inf') >= burst
    if m and (at >= now or full) then
      redis.call('ZREM', key, m)
      redis.call('ZADD', key, int(at), int(c + units) .. ':' .. int(k + units))
    else
      if not m and ty == 'zset' then redis.call('UNLINK', key) end
      local cum, when = units, now
      if m then cum, when = c + units, math.max(now, at + 1) end
      redis.call('ZADD', key, int(when), int(cum) .. ':' .. int(units))
    end
    done = units
  else
    -- From the newest entries: lowering an entry's cost and cum together keeps every
    -- older entry's cum as it was. Bounded by the log's size.
    while done < units do
      local m, at, c, k = newest()
      if m == false then return corrupt('a sliding-log entry of another format') end
      if not m then break end
      local take = math.min(k, units - done)
      redis.call('ZREM', key, m)
      if k > take then redis.call('ZADD', key, int(at), int(c - take) .. ':' .. int(k - take)) end
      done = done + take
    end
    if done == 0 then return { 0, q } end
  end
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', key, ms(tonumber(last[2]) + period - now)) end
  return { done, q }
end
return redis.error_reply('ERR redguard rate_adjust: unknown algorithm ' .. tostring(algo))
