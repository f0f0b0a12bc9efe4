-- connect (RELAY 7.4). ARGV[6]: environment.
-- Returns {'yes' | 'not_found' | 'unavailable', registration id, executor key, owner, ended}.
local ended = {}
local e = current(ARGV[6], ended)
if e == nil then return {'not_found', '', '', '', ended} end
if not within_grace(e) then return {'unavailable', '', '', '', ended} end
return {'yes', e.reg, e.key, e.owner, ended}
