-- Check several rate limits all-or-nothing at Redis's time.
-- KEYS: per limit i, KEYS[2i-1] its state key and KEYS[2i] its block (penalty) key.
-- ARGV[1] '0' to charge every limit when all admit, '1' to peek (write nothing), '2' to
-- judge (charge nothing, but write the penalties of limits that reject: phase one of a call
-- whose limits are in several Cluster slots); ARGV[2] a per-call nonce (sliding-log members);
-- then per limit 6 values: algorithm, interval_ns (the emission interval), period_us, burst,
-- cost, block_us.
-- Returns { now_us, then per limit: allowed (0/1), remaining, reset_us, retry_us }.
--
-- Numbers: every quantity is an integer number of microseconds (nanoseconds for GCRA
-- intervals below 1 ms, counted relative to now) or units below 2^53, so Lua's doubles hold
-- it exactly; numbers are formatted with %.0f / %.17g before reaching Redis, because Redis
-- would print them with 14 significant digits.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local peek = ARGV[1] == '1'
local charge = ARGV[1] == '0'
local nonce = ARGV[2]
local n = #KEYS / 2

local function int(x) return string.format('%.0f', x) end
-- ceil(x / d) for integers below 2^53, exact even where the quotient rounds.
local function ceil_div(x, d)
  local q = math.floor(x / d)
  if q * d < x then q = q + 1 end
  return q
end
local function num(x) return string.format('%.17g', x) end
local function ms(us) -- a PX/PEXPIRE value covering `us`, at least 1
  local v = math.ceil(us / 1000)
  if v < 1 then v = 1 end
  return int(v)
end

-- Data this script never writes at a limit's keys (another type, a hand-edited value) is
-- refused with a CORRUPT error naming the key: treating it as empty would silently admit.
-- Each algorithm checks what it reads as it reads it, and nothing is written before every
-- limit was read, so a refusal leaves every key as it was.
local function corrupt(key, detail)
  return redis.error_reply('CORRUPT ' .. key .. ' ' .. detail)
end

-- Checks of what sits at a key when it is not the reading algorithm's own state, built the
-- first time a limit needs them (hash algorithms, foreign data): a GCRA check never does.
local checks
local function validators()
  if checks then return checks end
  checks = {}
  -- A hash algorithm's state at `key` as a table, or nil and why it is not one.
  function checks.hash_fields(key)
    local h = redis.call('HGETALL', key)
    local s = {}
    for j = 1, #h, 2 do s[h[j]] = h[j + 1] end
    local fields = ({ fw = { 'w', 'n' }, sc = { 'w', 'c', 'p' }, tb = { 'v', 'u' },
      lb = { 'v', 'u' } })[s.a or '']
    if not fields then return nil, 'a hash without a known algorithm tag' end
    for _, f in ipairs(fields) do
      if not tonumber(s[f]) then
        return nil, 'field ' .. f .. ' of a ' .. s.a .. ' state is not a number'
      end
    end
    return s
  end
  -- `key` holds a `ty` that is not the state of the algorithm reading it: nil when it is
  -- another algorithm's state (a configuration change: replaced on commit), else the
  -- refusal. gcra's state is "<T><rrr>" or "-<T><rrrrrr>" (an integer), or "<tat>:<T>"
  -- before 0.1.
  function checks.foreign(key, ty)
    if ty == 'string' then
      local v = redis.call('GET', key)
      if not (string.match(v, '^%d%d%d%d+$') or string.match(v, '^%-%d%d%d%d%d%d%d+$')
          or string.match(v, '^%d+:%d+$')) then
        return corrupt(key, 'a string that is not a gcra state')
      end
    elseif ty == 'hash' then
      local _, why = checks.hash_fields(key)
      if why then return corrupt(key, why) end
    elseif ty ~= 'zset' then
      return corrupt(key, 'a ' .. ty .. ' is stored there')
    end
    return nil
  end
  -- The state of hash algorithm `algo` at `key` (nil when absent or another's), whether
  -- something else is there to replace, and the refusal when that is garbage.
  function checks.hash_state(key, algo)
    local ty = redis.call('TYPE', key).ok
    if ty == 'none' then return nil, false end
    if ty ~= 'hash' then return nil, true, checks.foreign(key, ty) end
    local s, why = checks.hash_fields(key)
    if why then return nil, true, corrupt(key, why) end
    if s.a ~= algo then return nil, true end
    return s, false
  end
  return checks
end

local out = { now }
local commits = {}
local penalties = {}
local all = true

for i = 1, n do
  local key, bkey = KEYS[2 * i - 1], KEYS[2 * i]
  local b = 2 + (i - 1) * 6
  local algo = ARGV[b + 1]
  local interval = tonumber(ARGV[b + 2])
  local period = tonumber(ARGV[b + 3])
  local burst = tonumber(ARGV[b + 4])
  local cost = tonumber(ARGV[b + 5])
  local block = tonumber(ARGV[b + 6])
  -- The interval in µs; a fraction when it is below 1 ms and not whole µs (then GCRA
  -- counts in ns).
  local T = interval / 1000

  local allowed, remaining, reset, retry = 0, 0, 0, 0
  local commit = nil
  -- Only a limit with a penalty reads its block key: a penalty left by a configuration that
  -- had one goes with it.
  local until_us = 0
  if block > 0 then
    local bv = redis.pcall('GET', bkey)
    if type(bv) == 'table' then
      return corrupt(bkey, 'a ' .. redis.call('TYPE', bkey).ok .. ' is stored there')
    elseif bv then
      until_us = tonumber(bv)
      if not until_us then return corrupt(bkey, 'the block deadline is not a number') end
    end
  end

  if until_us > now then
    -- Blocked: rejected without counting.
    retry = until_us - now
    reset = retry
  elseif algo == 'gcra' then
    -- State: one integer, so Redis keeps it unboxed (no string buffer), holding the interval
    -- it was computed with; the TAT (theoretical arrival time) is the key's expiry (PXAT, ms)
    -- less a sub-ms rest kept in the integer:
    --   "<T><rrr>": T in µs, rest rrr µs (intervals of whole µs: every rate up to 1e6/s
    --   whose interval divides evenly, and every interval from 1 ms up);
    --   "-<T><rrrrrr>": T in ns, rest rrrrrr ns (other intervals below 1 ms).
    -- Everything is counted in that unit, relative to now: the debt TAT - now stays below
    -- 2^51 whatever the clock reads. A GET that fails is another algorithm's hash or set (a
    -- configuration change: replaced on commit, as SET overwrites any type). When the
    -- interval changed, the debt is rescaled in units (not in time), so a lowered rate never
    -- admits beyond the new limit. "<tat>:<T>" (µs) is the format before 0.1's compaction,
    -- still read.
    local fine = interval % 1000 ~= 0
    local unit_t = fine and interval or T
    local v = redis.pcall('GET', key)
    local debt = 0
    if type(v) == 'table' then
      local bad = validators().foreign(key, redis.call('TYPE', key).ok)
      if bad then return bad end
    elseif v then
      local d, old_t, old_fine
      local n = string.match(v, '^%-(%d%d%d%d%d%d%d+)$')
      if n then
        n = tonumber(n)
        old_t, old_fine = math.floor(n / 1000000), true
        d = (redis.call('PEXPIRETIME', key) * 1000 - now) * 1000 - n % 1000000
      else
        local t_digits, r = string.match(v, '^(%d+)(%d%d%d)$')
        if t_digits then
          old_t = tonumber(t_digits)
          d = redis.call('PEXPIRETIME', key) * 1000 - tonumber(r) - now
        else
          local a
          a, old_t = string.match(v, '^(%d+):(%d+)$')
          if not a then return corrupt(key, 'a string that is not a gcra state') end
          old_t, d = tonumber(old_t), tonumber(a) - now
        end
        old_fine = false
      end
      if old_t > 0 and d > 0 then
        if old_fine == fine and old_t == unit_t then
          debt = d
        else
          debt = math.ceil(d / old_t * unit_t)
        end
      end
    end
    local tau = burst * unit_t
    local new = debt + cost * unit_t
    if new <= tau then
      allowed = 1
      remaining = math.floor((tau - new) / unit_t)
      reset = new
      local ms_now = math.floor(now / 1000)
      if fine then
        commit = function()
          -- x: the new TAT past the start of this millisecond, in ns.
          local x = (now - ms_now * 1000) * 1000 + new
          local up = ceil_div(x, 1000000)
          redis.call('SET', key, int(-(interval * 1000000 + up * 1000000 - x)),
            'PXAT', int(ms_now + up))
        end
      else
        commit = function()
          local x = now - ms_now * 1000 + new
          local up = ceil_div(x, 1000)
          redis.call('SET', key, int(T) .. string.format('%03d', up * 1000 - x),
            'PXAT', int(ms_now + up))
        end
      end
    else
      remaining = math.floor((tau - debt) / unit_t)
      reset = debt
      retry = new - tau
    end
    if fine then
      reset, retry = ceil_div(reset, 1000), ceil_div(retry, 1000)
    end
  elseif algo == 'fixed_window' then
    local s, replace, bad = validators().hash_state(key, 'fw')
    if bad then return bad end
    local win = math.floor(now / period)
    local used = 0
    if s and tonumber(s.w) == win then used = tonumber(s.n) or 0 end
    local win_end = (win + 1) * period
    if used + cost <= burst then
      allowed = 1
      remaining = burst - used - cost
      reset = win_end - now
      commit = function()
        if replace then redis.call('DEL', key) end
        redis.call('HSET', key, 'a', 'fw', 'w', int(win), 'n', int(used + cost))
        redis.call('PEXPIRE', key, ms(win_end - now))
      end
    else
      remaining = math.max(burst - used, 0)
      reset = win_end - now
      retry = win_end - now
    end
  elseif algo == 'sliding_window' then
    local ty = redis.call('TYPE', key).ok
    local replace = ty ~= 'zset' and ty ~= 'none'
    if replace then
      local bad = validators().foreign(key, ty)
      if bad then return bad end
    end
    local lo = '(' .. int(now - period)
    local used = 0
    if ty == 'zset' then used = redis.call('ZCOUNT', key, lo, '+inf') end
    if used + cost <= burst then
      allowed = 1
      remaining = burst - used - cost
      reset = period
      commit = function()
        if replace then redis.call('DEL', key) end
        redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - period))
        for j = 1, cost do
          redis.call('ZADD', key, int(now), nonce .. j)
        end
        redis.call('PEXPIRE', key, ms(period))
      end
    else
      remaining = math.max(burst - used, 0)
      -- The call fits once the (used + cost - burst)-th oldest entry leaves the window.
      local k = used + cost - burst
      local e = redis.call('ZRANGEBYSCORE', key, lo, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
      retry = tonumber(e[2]) + period - now
      local last = redis.call('ZREVRANGEBYSCORE', key, '+inf', lo, 'WITHSCORES', 'LIMIT', 0, 1)
      reset = tonumber(last[2]) + period - now
    end
  elseif algo == 'sliding_counter' then
    local s, replace, bad = validators().hash_state(key, 'sc')
    if bad then return bad end
    local win = math.floor(now / period)
    local cur, prev = 0, 0
    if s then
      local w = tonumber(s.w)
      if w == win then
        cur, prev = tonumber(s.c) or 0, tonumber(s.p) or 0
      elseif w == win - 1 then
        prev = tonumber(s.c) or 0
      end
    end
    local elapsed = now - win * period
    local est = prev * (period - elapsed) / period + cur
    if cur > 0 then
      reset = (win + 2) * period - now
    elseif prev > 0 then
      reset = (win + 1) * period - now
    end
    if est + cost <= burst then
      allowed = 1
      remaining = math.floor(burst - est - cost)
      reset = (win + 2) * period - now
      commit = function()
        if replace then redis.call('DEL', key) end
        redis.call('HSET', key, 'a', 'sc', 'w', int(win), 'c', int(cur + cost), 'p', int(prev))
        redis.call('PEXPIRE', key, ms((win + 2) * period - now))
      end
    else
      remaining = math.max(math.floor(burst - est), 0)
      local room = burst - cost - cur
      if room >= 0 and prev > 0 then
        -- Later in this window, once the previous window's weight has shrunk enough.
        retry = math.ceil(win * period + period * (1 - room / prev) - now)
      else
        -- In the next window, where this window's count becomes the weighted one.
        local e = 0
        if cur > 0 then e = period * (1 - (burst - cost) / cur) end
        if e < 0 then e = 0 end
        retry = math.ceil((win + 1) * period + e - now)
      end
      if retry < 1 then retry = 1 end
    end
  elseif algo == 'token_bucket' or algo == 'leaky_bucket' then
    -- Both keep the level in use (tokens taken / water held), in units, draining one unit
    -- per T microseconds; a token bucket's tokens are burst - level. Units rather than
    -- tokens survive a change of burst without admitting beyond the new one.
    local tag = algo == 'token_bucket' and 'tb' or 'lb'
    local s, replace, bad = validators().hash_state(key, tag)
    if bad then return bad end
    local level = 0 -- units in use, as a leaky bucket's level
    if s then
      local last = tonumber(s.u) or now
      level = (tonumber(s.v) or 0) - (now - last) / T
      if level < 0 then level = 0 end
    end
    if level + cost <= burst then
      allowed = 1
      local after = level + cost
      remaining = math.floor(burst - after)
      reset = math.ceil(after * T)
      commit = function()
        if replace then redis.call('DEL', key) end
        redis.call('HSET', key, 'a', tag, 'v', num(after), 'u', int(now))
        redis.call('PEXPIRE', key, ms(after * T))
      end
    else
      remaining = math.max(math.floor(burst - level), 0)
      reset = math.ceil(level * T)
      retry = math.ceil((level + cost - burst) * T)
      if retry < 1 then retry = 1 end
    end
  else
    return redis.error_reply('ERR redguard rate_check: unknown algorithm ' .. tostring(algo))
  end

  if allowed == 0 then
    all = false
    if block > 0 and not peek and until_us <= now then
      -- The penalty: reject this key for `block` without counting (written once every
      -- limit was read).
      penalties[#penalties + 1] = { bkey, int(now + block), ms(block) }
      retry = math.max(retry, block)
      reset = math.max(reset, block)
    end
  end
  commits[i] = commit
  out[#out + 1] = allowed
  out[#out + 1] = math.max(remaining, 0)
  out[#out + 1] = math.max(reset, 0)
  out[#out + 1] = math.max(retry, 0)
end

for _, p in ipairs(penalties) do
  redis.call('SET', p[1], p[2], 'PX', p[3])
end
if all and charge then
  for i = 1, n do commits[i]() end
end
return out
