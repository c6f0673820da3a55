-- A rate-limit key's quota override at `qkey` (its `:quota` companion key, in the same slot),
-- as values/quota.rs writes it: "q1 <count> <period_us> <burst> <interval_ns>". Returns nil
-- when there is none; false when what is there is not one (another type or shape, a number
-- outside the grammar's bounds), which the caller ignores (the code's limit applies) and
-- reports; else interval_ns, period_us, count, burst. One GET of a key that is usually
-- absent: the whole cost of overrides to a check without one.
local function quota(qkey)
  local v = redis.pcall('GET', qkey)
  if not v then return nil end
  if type(v) ~= 'string' then return false end
  local c, p, b, i = string.match(v, '^q1 (%d+) (%d+) (%d+) (%d+)$')
  if not c then return false end
  c, p, b, i = tonumber(c), tonumber(p), tonumber(b), tonumber(i)
  -- The grammar's bounds (rate.rs): count and burst 1 to 1e9, period 1 ms to 30 days, a
  -- burst spanning at most 2^50 µs; and the interval is the rate's (grammar::interval_ns:
  -- period / count rounded up, to whole µs from 1 ms). Every product is below 2^53: exact.
  if c < 1 or c > 1000000000 or p < 1000 or p > 2592000000000 or b < 1 or b > 1000000000
      or b * i > 1125899906842624000 then
    return false
  end
  local pn = p * 1000
  local unit = 1
  if pn >= 1000000 * c then unit = 1000 end
  if i % unit ~= 0 or i * c < pn or (i - unit) * c >= pn then return false end
  return i, p, c, b
end
