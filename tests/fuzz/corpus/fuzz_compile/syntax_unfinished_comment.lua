--[[ unfinished

