local f = coroutine.wrap(function()
  error('in co')
end)
f()