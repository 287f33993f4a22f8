local a = 1
local s = 'unfinished