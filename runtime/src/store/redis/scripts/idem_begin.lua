-- Begin an idempotent execution.
-- KEYS[1] record (hash); ARGV[1] owner, ARGV[2] fingerprint ('' = none), ARGV[3] ttl ms.
-- A begin that finds the record in progress marks it (`w`): the end of that execution
-- publishes on the record's name for the duplicates waiting for it (idem_finish.lua).
-- Returns {0} started, {1} retrying a FAIL, {2} in progress, {3, result} done,
-- {4} fingerprint mismatch, {5, status} unrecognised record, {6} outcome unknown.
local rec = redis.call('HMGET', KEYS[1], 'status', 'fp', 'result', 'w')
local status = rec[1]
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
if not status then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return {5, ''}
  end
  redis.call('HSET', KEYS[1], 'status', 'P', 'owner', ARGV[1], 'fp', ARGV[2], 'started', now_ms)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {0}
end
-- A failure releases the key for any payload: the retry's payload is the one that runs.
if status == 'F' then
  redis.call('HSET', KEYS[1], 'status', 'P', 'owner', ARGV[1], 'fp', ARGV[2], 'started', now_ms)
  redis.call('HDEL', KEYS[1], 'result', 'finished', 'w')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1}
end
local fp = rec[2]
if ARGV[2] ~= '' and fp and fp ~= '' and fp ~= ARGV[2] then
  return {4}
end
if status == 'P' then
  if not rec[4] then
    redis.call('HSET', KEYS[1], 'w', 1)
  end
  return {2}
elseif status == 'S' then
  return {3, rec[3] or ''}
elseif status == 'U' then
  return {6}
end
return {5, status}
