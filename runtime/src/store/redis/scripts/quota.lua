-- A rate-limit key's quota override at `qkey` (its `:quota` companion key, in the same slot),
-- as values/quota.rs writes it: "q1 <count> <period_us> <burst> <interval_ns>"; else, when
-- the call was given the handle's prefix-override hash (prefixes(): single node and
-- Sentinel, never a Cluster, where it is in another slot), the override of the longest state-
-- key prefix of `key` there. Returns nil when there is none; false when what is there is not
-- one (another type or shape, a number outside the grammar's bounds), which the caller
-- ignores (the code's limit applies) and reports; else interval_ns, period_us, count, burst.
-- One GET of a key that is usually absent (and one HGETALL per call, not per check): the
-- whole cost of overrides to a check without one.
local function quota_value(v)
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

-- Prefix overrides: the hash at `pkey` (admin/quota.rs), a field per state-key prefix
-- ("<prefix>:rate:{<scope>:<body prefix>"), its value "<expires_at_ms, 0: permanent> q1 ..".
-- Read once per call, kept as a list; false when it is not a hash (ignored, reported).
local prefix_list
local function prefixes(pkey)
  prefix_list = {}
  if not pkey then return end
  local h = redis.pcall('HGETALL', pkey)
  if type(h) ~= 'table' or h.err then
    prefix_list = false
    return
  end
  for j = 1, #h, 2 do prefix_list[#prefix_list + 1] = { h[j], h[j + 1] } end
end

local function quota(qkey, key, now_us)
  local v = redis.pcall('GET', qkey)
  if v then
    if type(v) ~= 'string' then return false end
    return quota_value(v)
  end
  if prefix_list == false then return false end
  if not prefix_list or #prefix_list == 0 then return nil end
  -- Exact key > longest prefix: an expired entry (the hash outlives its shorter fields until
  -- the next write prunes them) is skipped; a malformed longest one is reported as such.
  local best, len = nil, 0
  for _, e in ipairs(prefix_list) do
    local f = e[1]
    if #f > len and string.sub(key, 1, #f) == f then
      local at, rest = string.match(e[2], '^(%d+) (.+)$')
      if not at then
        best, len = false, #f
      elseif at == '0' or tonumber(at) * 1000 > now_us then
        best, len = rest, #f
      end
    end
  end
  if best == nil then return nil end
  if best == false then return false end
  return quota_value(best)
end
