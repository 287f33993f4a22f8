local x <close> = setmetatable({}, {__close = function() error('in close') end})
return 1