-- ceil(d * b / a) for whole d, a, b below 2^53: a debt of d counted at interval a, in units of
-- interval b (rate_check.lua and rate_adjust.lua convert a state of another interval with it).
-- Below 2^53 the product is exact, and so is the quotient's ceiling (a quotient that is not
-- whole is then at least 1/a from a whole number, more than a correctly rounded division can
-- move it). Beyond, d * b has no exact double: the product is built bit by bit of b as
-- q * a + m with m < a (the long multiplication of paper, reduced by a at every step), so
-- every intermediate is a whole number well below 2^53 and the result exact while it is below
-- 2^53 (the callers cap it at 2^52). Converting with d / a * b instead was off by 1 in about one
-- case in a hundred (a per-second burst read at 1 per day: the reset reported 1 µs early).
local function rescale(d, b, a)
  local x = d * b
  if x < 9007199254740992 then return math.ceil(x / a) end
  local whole = math.floor(d / a)
  local part = d - whole * a
  local q, m, p = 0, 0, 1
  while p * 2 <= b do p = p * 2 end
  local rest = b
  while p >= 1 do
    q, m = q * 2, m * 2
    if m >= a then q, m = q + 1, m - a end
    if rest >= p then
      rest = rest - p
      m = m + part
      if m >= a then q, m = q + 1, m - a end
    end
    p = p / 2
  end
  if m > 0 then q = q + 1 end
  return whole * b + q
end
