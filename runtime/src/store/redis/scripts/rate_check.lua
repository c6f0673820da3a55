-- Check several rate limits all-or-nothing at Redis's time.
-- KEYS: per limit i, KEYS[4i-3] its state key, KEYS[4i-2] its block (penalty) key, KEYS[4i-1]
-- its quota override (quota.lua) and KEYS[4i] its deny entry (deny.lua); then, off a
-- Cluster, the handle's prefix-override hash (quota.lua's prefixes()) and its pattern deny
-- hash (deny.lua): a denied key's call is refused with `DENIED <key> <reason>`, nothing
-- written.
-- ARGV[1] '0' to charge every limit when all admit, '1' to peek (write nothing), '2' to
-- judge (charge nothing, but write the penalties of limits that reject: phase one of a call
-- whose limits are in several Cluster slots), 'r<us>' to charge as '0' with a GCRA limit
-- that would admit within <us> µs admitting now, at its next free slot (retry_us of an
-- admission is then the time until that slot: the caller's to wait); then per limit 6 values: algorithm,
-- interval_ns (the emission interval), period_us, burst, cost, block_us (the code's; an
-- override replaces the interval, the period and the burst, or a window's count).
-- Returns { now_us, then per limit: allowed (0/1), remaining, reset_us, retry_us, the
-- override's capacity (0: none, -1: one that is not an override, ignored) and its
-- interval_ns (buckets) or period_us (windows) }.
--
-- Numbers: every quantity is an integer number of microseconds (nanoseconds for GCRA
-- intervals below 1 ms, counted relative to now) or units below 2^53, so Lua's doubles hold
-- it exactly; numbers are formatted with %.0f / %.17g before reaching Redis, because Redis
-- would print them with 14 significant digits. math.ceil(x / d) is exact for the x below
-- 2^51 it is used on (d = 1000 or 1e6): a quotient's fraction, at least 1/d, is then larger
-- than half the spacing of doubles near it.
--
-- Helpers a GCRA check does not need are built only when a limit does: every function
-- defined at the top level is a closure created on every run of the script.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local peek = ARGV[1] == '1'
local reserving = string.match(ARGV[1], '^r(%d+)$')
local reserve = reserving and tonumber(reserving) or 0
local charge = ARGV[1] == '0' or reserving ~= nil
local n = (#ARGV - 1) / 6
if #KEYS > 4 * n then
  prefixes(KEYS[4 * n + 1])
  denies(KEYS[4 * n + 2])
end
-- A denied key refuses the whole call before any limit is read (deny.lua): it consumes and
-- writes nothing. A peek only looks, so it is not refused.
if not peek then
  for i = 1, n do
    local why = denied(KEYS[4 * i - 3], KEYS[4 * i], now)
    if why then return redis.error_reply('DENIED ' .. KEYS[4 * i - 3] .. ' ' .. why) end
  end
end

local function int(x) return string.format('%.0f', x) end
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
-- Another algorithm's state is replaced after an UNLINK: it may be a large sorted set (a
-- sliding log of the earlier format held a member per unit), which UNLINK frees off the
-- main thread.

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
  local key, bkey = KEYS[4 * i - 3], KEYS[4 * i - 2]
  local b = 1 + (i - 1) * 6
  local algo = ARGV[b + 1]
  local interval = tonumber(ARGV[b + 2])
  local period = tonumber(ARGV[b + 3])
  local burst = tonumber(ARGV[b + 4])
  local cost = tonumber(ARGV[b + 5])
  local block = tonumber(ARGV[b + 6])
  local q_cap, q_unit = 0, 0
  local qi, qp, qc, qb = quota(KEYS[4 * i - 1], key, now)
  local window = algo == 'fixed_window' or algo == 'sliding_window' or algo == 'sliding_counter'
  if qi == false or (qi and algo == 'sliding_window' and qc > 10000) then
    -- Not an override, or one a sliding log cannot hold (one entry per call, 10,000 at
    -- most): the code's limit applies.
    q_cap = -1
  elseif qi then
    interval, period = qi, qp
    if window then burst, q_unit = qc, qp else burst, q_unit = qb, qi end
    q_cap = burst
  end
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
    local replace = false
    if type(v) == 'table' then
      local bad = validators().foreign(key, redis.call('TYPE', key).ok)
      if bad then return bad end
      replace = true
    elseif v then
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
          if not a then return corrupt(key, 'a string that is not a gcra state') end
          old_t, d = tonumber(old_t), tonumber(a) - now
        end
        old_fine = false
      end
      if old_t > 0 and d > 0 then
        if old_fine == fine and old_t == unit_t then
          debt = d
        else
          -- Rescaled (a billion units owed at 1 ns are 82,000 years at 1 per 30 days), then
          -- capped at 2^52: more than any burst spans, so no decision changes, and every
          -- number stays exact.
          debt = math.min(rescale(d, unit_t, old_t), 4503599627370496)
        end
      end
    end
    local tau = burst * unit_t
    local new = debt + cost * unit_t
    local ahead = reserve
    if fine then ahead = reserve * 1000 end
    if new <= tau + ahead then
      allowed = 1
      remaining = math.floor(math.max(tau - new, 0) / unit_t)
      reset = new
      -- Reserved: admitted at its slot, new - tau from now.
      retry = math.max(new - tau, 0)
      local ms_now = math.floor(now / 1000)
      if fine then
        commit = function()
          if replace then redis.call('UNLINK', key) end
          -- x: the new TAT past the start of this millisecond, in ns.
          local x = (now - ms_now * 1000) * 1000 + new
          local up = math.ceil(x / 1000000)
          redis.call('SET', key, int(-(interval * 1000000 + up * 1000000 - x)),
            'PXAT', int(ms_now + up))
        end
      else
        commit = function()
          if replace then redis.call('UNLINK', key) end
          local x = now - ms_now * 1000 + new
          local up = math.ceil(x / 1000)
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
      reset, retry = math.ceil(reset / 1000), math.ceil(retry / 1000)
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
        if replace then redis.call('UNLINK', key) end
        redis.call('HSET', key, 'a', 'fw', 'w', int(win), 'n', int(used + cost))
        redis.call('PEXPIRE', key, ms(win_end - now))
      end
    else
      remaining = math.max(burst - used, 0)
      reset = win_end - now
      retry = win_end - now
    end
  elseif algo == 'sliding_window' then
    -- State: a sorted set with one entry per admitted call, whatever its cost: score = the
    -- call's time (µs; max(now, newest + 1), so scores increase with every call and ranks
    -- follow calls even if the clock steps back), member = "<cum>:<cost>", cum = the units
    -- admitted up to this call since the log was last empty. Units in the window =
    -- cum(newest) - cum(oldest in the window) + cost(oldest in the window): a few O(log n)
    -- reads, whatever the cost; the log holds at most `count` entries (the maximum count
    -- bounds the key's size, and the work of its expiry). A log written before this
    -- format (one member per unit, named by a nonce) is read conservatively: its units in
    -- the window are counted and taken as one entry at its newest member's time, which
    -- replaces it on the next admission; such a key may reject for up to one period longer
    -- than it would have, never admit more.

    -- At most this many entries that left a sliding log's window are removed per call (each costs
    -- Redis 0.1 to 1 µs, measured on a log of 10,000); any number above 1 keeps up, since a call
    -- adds one entry.
    local LOG_TRIM = 16

    -- A sliding-log member "<cum>:<cost>" as two numbers, or nil for any other member.
    local function log_entry(member)
      if not member then return nil end
      local c, k = string.match(member, '^(%d+):(%d+)$')
      if not c then return nil end
      return tonumber(c), tonumber(k)
    end

    -- The time of the first entry in the window of the sliding log at `key` whose cum reaches
    -- `target`, or nil when an entry of another format is in the way. `first` = { cum, cost, time }
    -- of the window's oldest entry, `top` the newest entry's cum. The window's n entries are the
    -- last n ranks; a guess assuming equal costs (exact when they are) comes first, then bisection:
    -- O(log n) reads of O(log n) each.
    local function log_find(key, lo, first, top, target)
      if first[1] >= target then return first[3] end
      local n = redis.call('ZCOUNT', key, '(' .. int(lo), '+inf')
      local base = first[1] - first[2]
      -- Positions 0 (the oldest, already ruled out) .. n - 1 (the newest, whose cum is top).
      local a, b = 1, n - 1
      local p = math.ceil((target - base) * n / (top - base)) - 1
      while a <= b do
        if p < a or p > b then p = math.floor((a + b) / 2) end
        local e = redis.call('ZRANGE', key, p - n, p - n, 'WITHSCORES')
        local c, k = log_entry(e[1])
        if not c then return nil end
        if c < target then
          a = p + 1
        elseif c - k >= target then
          b = p - 1
        else
          return tonumber(e[2])
        end
        p = math.floor((a + b) / 2)
      end
      return nil
    end

    local lo = now - period
    local newest = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    local replace, merge = false, false
    -- Units in the window, cum of the newest entry and its time, the window's oldest entry.
    local used, top, last, first = 0, 0, nil, nil
    if newest.err then
      local bad = validators().foreign(key, redis.call('TYPE', key).ok)
      if bad then return bad end
      replace = true
    elseif newest[1] then
      last = tonumber(newest[2])
      if last > lo then
        local oldest = redis.call('ZRANGE', key, '(' .. int(lo), '+inf', 'BYSCORE', 'LIMIT', 0, 1,
          'WITHSCORES')
        local c = log_entry(newest[1])
        local oc, ok = log_entry(oldest[1])
        if c and oc then
          used, top, first = c - oc + ok, c, { oc, ok, tonumber(oldest[2]) }
        else
          used = redis.call('ZCOUNT', key, '(' .. int(lo), '+inf')
          top, merge, first = used, true, { used, used, last }
        end
      end
    end
    if used + cost <= burst then
      allowed = 1
      remaining = burst - used - cost
      local at = now
      if last and last >= now then at = last + 1 end
      reset = at + period - now
      commit = function()
        if replace or merge or (last and last <= lo) then
          -- Nothing of the old log is needed (or it is folded into one entry): drop it whole,
          -- freed off the main thread when large.
          redis.call('UNLINK', key)
          if merge then redis.call('ZADD', key, int(last), int(used) .. ':' .. int(used)) end
        elseif last then
          -- Entries that left the window go, oldest first, at most LOG_TRIM per call, so no
          -- call frees a window's worth at once; the log still never exceeds `count`
          -- entries (each admitted call adds one and drops up to LOG_TRIM stale ones).
          local stale = redis.call('ZCOUNT', key, '-inf', int(lo))
          if stale > 0 then
            redis.call('ZREMRANGEBYRANK', key, 0, math.min(stale, LOG_TRIM) - 1)
          end
        end
        redis.call('ZADD', key, int(at), int(top + cost) .. ':' .. int(cost))
        redis.call('PEXPIRE', key, ms(at + period - now))
      end
    else
      remaining = math.max(burst - used, 0)
      reset = last + period - now
      -- The call fits once the entry holding unit `top - (burst - cost)` has left; an entry
      -- of another format on the way means waiting for the whole window.
      local at = log_find(key, lo, first, top, top - (burst - cost)) or last
      retry = at + period - now
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
        if replace then redis.call('UNLINK', key) end
        redis.call('HSET', key, 'a', 'sc', 'w', int(win), 'c', int(cur + cost), 'p', int(prev))
        redis.call('PEXPIRE', key, ms((win + 2) * period - now))
      end
    else
      remaining = math.max(math.floor(burst - est), 0)
      local room = burst - cost - cur
      -- Counted from the window's end, relative to now: a time since the epoch (≈ 2^52 µs)
      -- has no room left for a fraction, which lost up to a µs of the wait.
      local edge = (win + 1) * period - now
      if room >= 0 and prev > 0 then
        -- Later in this window, once the previous window's weight has shrunk enough:
        -- prev × (period - e) / period <= room.
        retry = edge - math.floor(period * room / prev)
      else
        -- In the next window, where this window's count becomes the weighted one:
        -- cur × (period - e) / period + cost <= burst.
        local e = 0
        if cur > burst - cost then e = period - math.floor(period * (burst - cost) / cur) end
        retry = edge + e
      end
      if retry < 1 then retry = 1 end
    end
  elseif algo == 'token_bucket' or algo == 'leaky_bucket' then
    -- Both are GCRA with the state spelled out: the level in use (tokens taken / water held)
    -- in units, draining one unit per interval; a token bucket's tokens are burst - level.
    -- Units rather than tokens survive a change of burst without admitting beyond the new
    -- one. State: v the level (units), u its time (µs), t the interval it was counted at
    -- (ns; absent before 0.2). Decisions are made on the debt, level × interval, a whole
    -- number in the unit GCRA counts in (µs, or ns for an interval that is not whole µs):
    -- the level is read back into it exactly (v × interval is within 2^-52 of it, and the
    -- debt is below 2^51), so refills, resets and retries are exact; with floats throughout,
    -- a drained 7/s bucket reported its reset 1 µs late. A level counted at another interval
    -- drains at it until now, then keeps its units, rounded up to the new unit, as GCRA's
    -- debt does.
    local tag = algo == 'token_bucket' and 'tb' or 'lb'
    local s, replace, bad = validators().hash_state(key, tag)
    if bad then return bad end
    local fine = interval % 1000 ~= 0
    local unit_t = fine and interval or T
    local per_us = fine and 1000 or 1
    local debt = 0
    if s then
      local v, old = tonumber(s.v), tonumber(s.t)
      -- The unit the level was counted in: its interval's, or this one's before t was kept.
      local old_fine, old_t = fine, unit_t
      if old then
        old_fine = old % 1000 ~= 0
        old_t = old_fine and old or old / 1000
      end
      local d = v * old_t
      if old then d = math.floor(d + 0.5) else d = math.ceil(d) end
      -- Drained at that interval until now (as GCRA's TAT is), then in this one's units.
      d = d - (now - tonumber(s.u)) * (old_fine and 1000 or 1)
      if d > 0 then
        if old == interval then
          debt = d
        else
          debt = math.min(rescale(d, unit_t, old_t), 4503599627370496)
        end
      end
    end
    local tau = burst * unit_t
    local new = debt + cost * unit_t
    if new <= tau then
      allowed = 1
      remaining = math.floor((tau - new) / unit_t)
      reset = math.ceil(new / per_us)
      commit = function()
        if replace then redis.call('UNLINK', key) end
        redis.call('HSET', key, 'a', tag, 'v', num(new / unit_t), 'u', int(now), 't', int(interval))
        redis.call('PEXPIRE', key, ms(reset))
      end
    else
      remaining = math.floor((tau - debt) / unit_t)
      reset = math.ceil(debt / per_us)
      retry = math.ceil((new - tau) / per_us)
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
  out[#out + 1] = q_cap
  out[#out + 1] = q_unit
end

for _, p in ipairs(penalties) do
  redis.call('SET', p[1], p[2], 'PX', p[3])
end
if all and charge then
  for i = 1, n do commits[i]() end
end
return out
