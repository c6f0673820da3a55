-- GCRA checks of single limits without a penalty, several independent ones per call (the
-- store coalesces concurrent calls on a connection into one run): rate_check.lua's GCRA
-- path with only what such a check needs, so one decision costs Redis a GET, a PEXPIRETIME
-- and a SET and no closures or tables beyond the reply.
-- KEYS: per check i, KEYS[3i-2] its state key, KEYS[3i-1] its quota override (quota.lua) and
-- KEYS[3i] its deny entry (deny.lua); then, off a Cluster, the handle's prefix-override hash
-- (quota.lua's prefixes()) and its pattern deny hash (deny.lua).
-- ARGV[1] '0' to charge each check that admits, '1' to peek (write nothing); then per check
-- 3 values: interval_ns, burst, cost (the code's; an override replaces the first two).
-- Returns one string of integers separated by spaces: now_us, then per check allowed (0/1),
-- remaining, reset_us, retry_us, then the override's burst (0: none, -1: one that is not
-- an override, ignored) and interval_ns, with allowed = -1 (and nothing written) for a key this
-- script does not read: another type, a state of another interval or an earlier format. The
-- store decides those with rate_check.lua, which converts or refuses them; allowed = -2 (and
-- nothing read or written) for a key on its deny list (deny.lua, when charging), whose
-- reason follows the numbers: after them, one line per denied check, in order ('\n' before
-- each; control characters of a reason written by hand become spaces). One string rather
-- than an array: the client parses an array's integers one by one, at several times the
-- cost of splitting a string, and a call carries up to 4 × 128 of them.
--
-- The state and every number are rate_check.lua's (see its GCRA branch and its notes on
-- exactness): "<T><rrr>" for intervals of whole µs, "-<T><rrrrrr>" (ns) for others, the TAT
-- being the key's expiry (PXAT, ms) less the sub-ms rest kept in the integer.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local charge = ARGV[1] == '0'
local ms_now = math.floor(now / 1000)
local out = { string.format('%.0f', now) }

local n = (#ARGV - 1) / 3
if #KEYS > 3 * n then
  prefixes(KEYS[3 * n + 1])
  denies(KEYS[3 * n + 2])
end
local reasons = {}
for i = 1, n do
  local key = KEYS[3 * i - 2]
  local why = charge and denied(key, KEYS[3 * i], now)
  if why then
    out[i + 1] = '-2 0 0 0 0 0'
    reasons[#reasons + 1] = (string.gsub(why, '%c', ' '))
  else
    local interval = tonumber(ARGV[3 * i - 1])
    local burst = tonumber(ARGV[3 * i])
    local cost = tonumber(ARGV[3 * i + 1])
    local q_burst = 0
    local qi, _, _, qb = quota(KEYS[3 * i - 1], key, now)
    if qi then
      interval, burst, q_burst = qi, qb, qb
    elseif qi == false then
      q_burst = -1
    end
    local fine = interval % 1000 ~= 0
    local unit_t = interval
    if not fine then unit_t = interval / 1000 end
    local v = redis.pcall('GET', key)
    local debt = 0
    local known = type(v) ~= 'table'
    if known and v then
      local d
      if fine then
        local n = string.match(v, '^%-(%d%d%d%d%d%d%d+)$')
        n = n and tonumber(n)
        if n and math.floor(n / 1000000) == interval then
          d = (pexpiretime(key) * 1000 - now) * 1000 - n % 1000000
        end
      else
        local t_digits, r = string.match(v, '^(%d+)(%d%d%d)$')
        if t_digits and tonumber(t_digits) == unit_t then
          d = pexpiretime(key) * 1000 - tonumber(r) - now
        end
      end
      if not d then
        known = false
      elseif d > 0 then
        debt = d
      end
    end
    if known then
      local tau = burst * unit_t
      local new = debt + cost * unit_t
      local allowed, remaining, reset, retry = 1, 0, new, 0
      if new <= tau then
        remaining = math.floor((tau - new) / unit_t)
        if charge then
          if fine then
            -- x: the new TAT past the start of this millisecond, in ns.
            local x = (now - ms_now * 1000) * 1000 + new
            local up = math.ceil(x / 1000000)
            redis.call('SET', key, string.format('%.0f', -(interval * 1000000 + up * 1000000 - x)),
              'PXAT', string.format('%.0f', ms_now + up))
          else
            local x = now - ms_now * 1000 + new
            local up = math.ceil(x / 1000)
            redis.call('SET', key, string.format('%.0f%03d', unit_t, up * 1000 - x),
              'PXAT', string.format('%.0f', ms_now + up))
          end
        end
      else
        allowed = 0
        remaining = math.floor((tau - debt) / unit_t)
        reset = debt
        retry = new - tau
      end
      if fine then
        reset, retry = math.ceil(reset / 1000), math.ceil(retry / 1000)
      end
      out[i + 1] = string.format('%d %.0f %.0f %.0f %d %.0f', allowed, math.max(remaining, 0),
        math.max(reset, 0), math.max(retry, 0), q_burst, interval)
    else
      out[i + 1] = '-1 0 0 0 0 0'
    end
  end
end
if #reasons > 0 then
  return table.concat(out, ' ') .. '\n' .. table.concat(reasons, '\n')
end
return table.concat(out, ' ')
