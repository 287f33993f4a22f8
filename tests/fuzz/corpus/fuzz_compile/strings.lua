local s = inputs.s .. "|" .. tostring(inputs.b) .. "|" .. utf8.char(72, 228, 8364)
local parts = {}
for w in s:gmatch("[^|]+") do parts[#parts + 1] = w:upper() end
table.sort(parts)
return {table.concat(parts, ","), #inputs.raw, s:byte(1, -1)}
