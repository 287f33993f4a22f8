local mt = {}
local t = setmetatable({}, mt)
mt.__gc = function() ran = true end
t = nil
for i = 1, 200000 do local g = {i} end
return ran == nil