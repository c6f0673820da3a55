-- Read guard state as stored, for the operator's tools (redguard::admin): one atomic look at
-- a key and its companions, at Redis's time.
-- KEYS: the keys to read (one hash tag). ARGV[1]: most members of a sorted set to return.
-- Returns { secs, micros, then per key { type, PEXPIRETIME (-2 absent, -1 no TTL), value } }:
-- value is { string } for a string; field, value, ... for a hash, with field `result` (an
-- idempotency record's stored value, possibly large) replaced by '#result' and its length;
-- { card, member, score, ... } (lowest scores first) for a sorted set; {} otherwise.
local t = redis.call('TIME')
local out = { t[1], t[2] }
local limit = tonumber(ARGV[1])
for _, key in ipairs(KEYS) do
  local ty = redis.call('TYPE', key).ok
  local at = -2
  local v = {}
  if ty ~= 'none' then
    at = pexpiretime(key)
  end
  if ty == 'string' then
    v = { redis.call('GET', key) }
  elseif ty == 'hash' then
    for _, field in ipairs(redis.call('HKEYS', key)) do
      if field == 'result' then
        v[#v + 1] = '#result'
        v[#v + 1] = tostring(redis.call('HSTRLEN', key, field))
      else
        v[#v + 1] = field
        v[#v + 1] = redis.call('HGET', key, field)
      end
    end
  elseif ty == 'zset' then
    v = redis.call('ZRANGE', key, 0, limit - 1, 'WITHSCORES')
    table.insert(v, 1, tostring(redis.call('ZCARD', key)))
  end
  out[#out + 1] = { ty, at, v }
end
return out
