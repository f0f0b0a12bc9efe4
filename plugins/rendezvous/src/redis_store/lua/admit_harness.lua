-- May a harness socket for a registration open on this node? Only the node holding the
-- executor socket routes its frames. ARGV[6..8]: environment, registration id, this node.
-- Returns {'ok', epoch, tenant, ended} | {'404' | '410' | '503', '', '', ended}
--       | {'elsewhere', owner, '', ended}.
local ended = {}
local e, status = upgrade_target(ARGV[6], ARGV[7], ended)
if e == nil then return {status, '', '', ended} end
if not within_grace(e) then return {'503', '', '', ended} end
if e.owner ~= '' and e.owner ~= ARGV[8] then return {'elsewhere', e.owner, '', ended} end
return {'ok', e.epoch, e.tenant, ended}
