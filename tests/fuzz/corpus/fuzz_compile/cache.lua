count = (count or 0) + 1
local co = coroutine.wrap(function(x) coroutine.yield(x * 2) return x end)
local ok, err = pcall(error, {code = 1})
return {count = count, co = co(21), ok = ok, m = inputs.m.x, i = math.tointeger(3.0), f = 1 // 0.0}
