-- Loaded ahead of every script that hands out fencing tokens (see `lua!` in lua.rs).
--
-- The next fencing token of the counter at `counter`, at time `t` (a TIME reply; read when not
-- given), or nil when something else is stored there. Above every token the counter handed
-- out, and never below Redis's clock in microseconds, so a master promoted after losing the
-- last increments still hands out larger tokens than the old one did. Tokens stay below 2^53,
-- where Lua's doubles are exact.
local function next_fence(counter, ttl, t)
  local last = redis.pcall('GET', counter)
  if type(last) == 'table' then
    return nil
  end
  local n = 0
  if last then
    n = string.match(last, '^%d+$') and tonumber(last)
    if not n or n >= 9007199254740991 then
      return nil
    end
  end
  t = t or redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = string.format('%.0f', math.max(n + 1, now))
  redis.call('SET', counter, fence, 'PX', ttl)
  return fence
end
