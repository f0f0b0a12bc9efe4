-- Deletes the registrations that are due. ARGV[6]: at most this many.
-- Returns the registrations ended.
local ended = {}
sweep(tonumber(ARGV[6]), ended)
return ended
