goto f
local x
::f::
return x