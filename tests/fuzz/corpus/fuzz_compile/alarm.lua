local t = inputs.t or {}
local hi, n = -math.huge, 0
for i, v in ipairs(t) do
  if v > hi then hi = v end
  n = n + 1
end
if hi > 2 then
  return {alarm = true, level = hi, count = n, msg = string.format("high: %d of %s", hi, inputs.s)}
end
return {alarm = false}
