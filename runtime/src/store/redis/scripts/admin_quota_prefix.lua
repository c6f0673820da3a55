-- A handle's prefix overrides (quota.lua's prefixes()): KEYS[1] the hash, a field per state-key
-- prefix, its value "<expires_at_ms, 0: permanent> <override>". ARGV[1] 'list', 'set' or
-- 'del'; for 'set'/'del' ARGV[2] the field, for 'set' ARGV[3] the override, ARGV[4] its TTL
-- in ms ('0': permanent) and ARGV[5] the most fields the hash may hold.
-- Every write drops expired fields and gives the hash the expiry of its latest field (none
-- while a permanent one is there): the hash lives no longer than its overrides.
-- 'list' returns { now_ms, field, value, ... } of the live fields; 'set' and 'del' return 1
-- when the field was there, 0 when not, and 'set' -1 (nothing written) when the hash is full.
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function expires(v)
  return tonumber(string.match(v, '^(%d+) ') or '')
end
local ty = redis.call('TYPE', key).ok
if ty ~= 'hash' and ty ~= 'none' then
  return redis.error_reply('CORRUPT ' .. key .. ' is not a hash of prefix overrides')
end
local h = redis.call('HGETALL', key)
if ARGV[1] == 'list' then
  local out = { string.format('%.0f', now) }
  for j = 1, #h, 2 do
    local at = expires(h[j + 1])
    if not at or at == 0 or at > now then
      out[#out + 1] = h[j]
      out[#out + 1] = h[j + 1]
    end
  end
  return out
end
local field = ARGV[2]
-- The live fields after this write, rewritten whole: a new hash has no TTL, so a permanent
-- field needs no PERSIST (not among the services' ACL grants, which an operator's extend).
local keep, had = {}, false
for j = 1, #h, 2 do
  local at = expires(h[j + 1])
  if not at or at == 0 or at > now then
    if h[j] == field then had = true else keep[#keep + 1] = { h[j], h[j + 1] } end
  end
end
if ARGV[1] == 'set' then
  if not had and #keep >= tonumber(ARGV[5]) then return -1 end
  local at = 0
  if ARGV[4] ~= '0' then at = now + tonumber(ARGV[4]) end
  keep[#keep + 1] = { field, string.format('%.0f', at) .. ' ' .. ARGV[3] }
end
redis.call('DEL', key)
local latest, forever = 0, false
for _, e in ipairs(keep) do
  redis.call('HSET', key, e[1], e[2])
  local at = expires(e[2])
  if not at or at == 0 then
    forever = true
  elseif at > latest then
    latest = at
  end
end
if #keep > 0 and not forever then
  redis.call('PEXPIRE', key, string.format('%.0f', latest - now))
end
if had then return 1 end
return 0
