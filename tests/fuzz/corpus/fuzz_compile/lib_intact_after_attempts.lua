pcall(function() string.upper = nil end)
pcall(rawset, string, 'upper', nil)
pcall(setmetatable, string, {})
return ('abc'):upper() .. string.upper('d') .. math.pi