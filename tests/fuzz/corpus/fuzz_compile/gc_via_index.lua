local t = setmetatable({}, setmetatable({}, {__index = function(_, k) if k == '__gc' then return function() ran = true end end end}))
t = nil
for i = 1, 200000 do local g = {i} end
return ran == nil