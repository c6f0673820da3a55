-- Deletes an idempotency record only if it is still as the operator read it
-- (redguard::admin forget): every field given has the value given. A record finished, taken
-- over or begun anew since the read is left alone, so what forget reports is what it deleted.
-- KEYS[1] the record; ARGV field, value pairs (as admin_read.lua returned them).
-- Returns 1 deleted, 0 changed or gone since the read (nothing changed).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) ~= ARGV[i + 1] then
    return 0
  end
end
redis.call('DEL', KEYS[1])
return 1
