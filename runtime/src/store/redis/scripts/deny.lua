-- Deny lists (values/deny.rs): an exact key's entry at its `:deny` companion (`dkey`, in the
-- limit's slot: one GET per check, on a Cluster too), and the handle's hash of prefixes and
-- networks (`pkey`, read once per call into a list, nil when absent), passed off a Cluster
-- only (there it is in another slot than the keys). The whole cost to a call without deny
-- entries: one GET per check and one HGETALL, of absent keys. Something that is not a
-- string or a hash, or a malformed entry, denies nothing.
local deny_list
local function denies(pkey)
  deny_list = nil
  if not pkey then return end
  local h = redis.pcall('HGETALL', pkey)
  if type(h) ~= 'table' or h.err or #h == 0 then return end
  deny_list = {}
  for j = 1, #h, 2 do
    local f = h[j]
    local at, kind, reason = string.match(h[j + 1], '^(%d+) (%S+) ?(.*)$')
    if at then
      -- What a key must start with, cut once here rather than per check: the prefix less
      -- its '*', or a network entry's scope.
      local start
      if kind == 'p' then
        start = string.sub(f, 1, -2)
      else
        local slen = string.match(kind, '^c[46]:(%d+):')
        start = slen and string.sub(f, 1, tonumber(slen)) or f
      end
      deny_list[#deny_list + 1] = { start, tonumber(at), kind, reason }
    end
  end
end

-- `n` (0..2^width-1) as `width` characters of '0'/'1'.
local function bin(n, width)
  local s = {}
  for b = width - 1, 0, -1 do
    if math.floor(n / 2 ^ b) % 2 == 1 then s[#s + 1] = '1' else s[#s + 1] = '0' end
  end
  return table.concat(s)
end

local function hex_groups(s)
  local g = {}
  if s == '' then return g end
  for x in string.gmatch(s .. ':', '([^:]*):') do g[#g + 1] = x end
  return g
end

-- The address of a key body's last ':'-separated part: its family ('4'/'6'), its bits as
-- '0'/'1' text and its own prefix length (the http layer's IPv6 keys are blocks,
-- `2001-db8--_64`); nil when it is not one.
local function key_address(body)
  local last = string.match(body, '([^:]*)$')
  local a, b, c, d = string.match(last, '^(%d+)%.(%d+)%.(%d+)%.(%d+)$')
  if a then
    local out = {}
    for _, x in ipairs({ a, b, c, d }) do
      -- As Rust's parser: no leading zeros.
      if #x > 3 or (#x > 1 and string.sub(x, 1, 1) == '0') or tonumber(x) > 255 then
        return nil
      end
      out[#out + 1] = bin(tonumber(x), 8)
    end
    return '4', table.concat(out), 32
  end
  local addr, own = string.match(last, '^([%x%-]+)_(%d+)$')
  if not addr then addr, own = string.match(last, '^([%x%-]+)$'), '128' end
  if not addr then return nil end
  own = tonumber(own)
  if own > 128 then return nil end
  addr = string.gsub(addr, '%-', ':')
  local l, r = string.match(addr, '^(.-)::(.*)$')
  local gs
  if l then
    local lg, rg = hex_groups(l), hex_groups(r)
    if #lg + #rg > 7 then return nil end
    gs = lg
    for _ = 1, 8 - #lg - #rg do gs[#gs + 1] = '0' end
    for _, x in ipairs(rg) do gs[#gs + 1] = x end
  else
    gs = hex_groups(addr)
    if #gs ~= 8 then return nil end
  end
  local out = {}
  for _, x in ipairs(gs) do
    if not string.match(x, '^%x%x?%x?%x?$') then return nil end
    out[#out + 1] = bin(tonumber(x, 16), 16)
  end
  return '6', table.concat(out), own
end

-- The reason of the first live entry that denies the state key `key` ("<prefix>:rate:{<scope>:
-- <body>}", its entry at `dkey`), or nil.
local function denied(key, dkey, now_us)
  local v = redis.pcall('GET', dkey)
  if type(v) == 'string' then
    local at, reason = string.match(v, '^(%d+) x ?(.*)$')
    if at and (at == '0' or tonumber(at) * 1000 > now_us) then return reason end
  end
  if not deny_list then return nil end
  -- The key's address, parsed once per check and only when a network entry needs it.
  local parsed, kf, bits, own = false
  for _, e in ipairs(deny_list) do
    local start, kind = e[1], e[3]
    -- A plain find anchored at 1: no substring made per check and entry.
    if (e[2] == 0 or e[2] * 1000 > now_us) and string.find(key, start, 1, true) == 1 then
      if kind == 'p' then
        return e[4]
      else
        local family, slen, net = string.match(kind, '^c([46]):(%d+):([01]*)$')
        slen = tonumber(slen)
        if family then
          if not parsed then
            parsed = true
            if string.sub(key, -1) == '}' then
              kf, bits, own = key_address(string.sub(key, slen + 1, -2))
            end
          end
          if kf == family and own >= #net and string.sub(bits, 1, #net) == net then
            return e[4]
          end
        end
      end
    end
  end
  return nil
end
