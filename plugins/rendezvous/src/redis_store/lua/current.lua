-- validate (RELAY 8.3): the environment's current registration. ARGV[6]: environment.
-- Returns {registration id or '', ended}.
local ended = {}
local e = current(ARGV[6], ended)
if e == nil then return {'', ended} end
return {e.reg, ended}
