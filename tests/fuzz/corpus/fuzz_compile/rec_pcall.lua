local function f() local ok, e = pcall(f) if not ok then error(e, 0) end return e end
return f()