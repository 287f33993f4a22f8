leaked = 1
_G.leaked_g = 2
rawset(_G, 'leaked_raw', 3)
_ENV.leaked_env = 4
setmetatable(_G, {__index = function() return 'from A' end})
return leaked + leaked_g + leaked_raw + leaked_env