-- Loaded ahead of every script that reads a key's expiry (see `lua!` in lua.rs).
--
-- pexpiretime(key): the key's absolute expiry in ms (-1 without a TTL, -2 absent), as
-- PEXPIRETIME (Redis 7.0+) answers. On Redis 6.2, which lacks it, the expiry is PTTL plus the
-- millisecond PTTL counted from: 6.2 and 7.0 count a script's PTTL from the clock at the call
-- (not from the script's start), so the call is read between two clock readings, and kept when
-- both fall in the same millisecond; then it is exact. Otherwise it is read again; after three
-- misses the later millisecond is taken, which can only overstate the expiry (a GCRA debt then
-- errs toward refusing). The readings are `redis.call("TIME")`, which the test-util pinned
-- clock leaves alone: PTTL counts from the server's real clock. The first call learns which
-- the server has: one failed call per script run on 6.2, nothing more on 7.0+.
local has_pexpiretime
local function pexpiretime(key)
  if has_pexpiretime ~= false then
    local at = redis.pcall('PEXPIRETIME', key)
    if type(at) == 'number' then
      return at
    end
    has_pexpiretime = false
  end
  local ms, left
  for _ = 1, 3 do
    local a = redis.call("TIME")
    left = redis.call('PTTL', key)
    local b = redis.call("TIME")
    ms = tonumber(b[1]) * 1000 + math.floor(tonumber(b[2]) / 1000)
    if left < 0 or tonumber(a[1]) * 1000 + math.floor(tonumber(a[2]) / 1000) == ms then
      break
    end
  end
  if left < 0 then
    return left
  end
  return ms + left
end
