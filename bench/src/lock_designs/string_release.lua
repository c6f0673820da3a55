local v = redis.call('GET', KEYS[1])
if not v or string.match(v, '^%d+:%d+:(.*)$') ~= ARGV[1] then
  return -1
end
redis.call('DEL', KEYS[1])
return 0
