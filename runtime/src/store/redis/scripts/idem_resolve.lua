-- An operator's verdict on a record: SUCCESS with a result, or FAIL.
-- KEYS[1] record; ARGV[1] 'S' or 'F', ARGV[2] result, ARGV[3] '1' to overwrite a PROCESSING
-- or SUCCESS record too.
-- Returns {0, status} resolved (the status it had), {1, status} refused, {2} no record,
-- {3, status} unrecognised record. The record keeps its TTL (HSET leaves it).
local rec = redis.call('HMGET', KEYS[1], 'status', 'w')
local status = rec[1]
if not status then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return {3, ''}
  end
  return {2}
end
if status ~= 'P' and status ~= 'S' and status ~= 'F' and status ~= 'U' then
  return {3, status}
end
if (status == 'P' or status == 'S') and ARGV[3] ~= '1' then
  return {1, status}
end
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
if ARGV[1] == 'S' then
  redis.call('HSET', KEYS[1], 'status', 'S', 'result', ARGV[2], 'finished', now_ms, 'owner', 'resolved')
else
  redis.call('HSET', KEYS[1], 'status', 'F', 'finished', now_ms, 'owner', 'resolved')
  redis.call('HDEL', KEYS[1], 'result')
end
-- A forced verdict on a PROCESSING record ends what duplicates wait for (idem_begin.lua).
if rec[2] then
  redis.call('HDEL', KEYS[1], 'w')
  redis.call('PUBLISH', KEYS[1], '1')
end
return {0, status}
