-- Begin a batch of idempotent executions: idem_begin.lua's transitions for each key, in
-- one script (the keys share a slot: a single node, or one Cluster slot group). A batch
-- never waits for an execution in progress, so it does not mark one (`w`) as idem_begin.lua does.
-- KEYS[i] record i; ARGV[1] ttl ms, ARGV[2i] owner i, ARGV[2i+1] fingerprint i ('' = none).
-- Returns {code_1, value_1, code_2, value_2, ...}, codes as idem_begin.lua's: 0 started,
-- 1 retrying a FAIL, 2 in progress, 3 done (value: the result), 4 fingerprint mismatch,
-- 5 unrecognised record (value: its status), 6 outcome unknown; value '' when none.
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local ttl = ARGV[1]
local out = {}
for i, key in ipairs(KEYS) do
  local owner = ARGV[2 * i]
  local fp_new = ARGV[2 * i + 1]
  local rec = redis.call('HMGET', key, 'status', 'fp', 'result')
  local status = rec[1]
  local code, value = 5, ''
  if not status then
    if redis.call('EXISTS', key) == 1 then
      code = 5
    else
      redis.call('HSET', key, 'status', 'P', 'owner', owner, 'fp', fp_new, 'started', now_ms)
      redis.call('PEXPIRE', key, ttl)
      code = 0
    end
  elseif status == 'F' then
    -- A failure releases the key for any payload: the retry's payload is the one that runs.
    redis.call('HSET', key, 'status', 'P', 'owner', owner, 'fp', fp_new, 'started', now_ms)
    redis.call('HDEL', key, 'result', 'finished', 'w')
    redis.call('PEXPIRE', key, ttl)
    code = 1
  elseif fp_new ~= '' and rec[2] and rec[2] ~= '' and rec[2] ~= fp_new then
    code = 4
  elseif status == 'P' then
    code = 2
  elseif status == 'S' then
    code, value = 3, rec[3] or ''
  elseif status == 'U' then
    code = 6
  else
    code, value = 5, status
  end
  out[2 * i - 1] = code
  out[2 * i] = value
end
return out
