local v = redis.call('GET', KEYS[1])
local fence, owner = string.match(v or '', '^(%d+):%d*:(.*)$')
if not owner or owner == '' or owner ~= ARGV[1] then
  return -1
end
redis.call('SET', KEYS[1], fence .. '::', 'PX', ARGV[3])
return 0
