-- May an executor socket for a registration open (RELAY 8.4 checks 5-7)? Executors may
-- land on any node. ARGV[6..7]: environment, registration id.
-- Returns {'ok' | '404' | '410', epoch, ended}.
local ended = {}
local e, status = upgrade_target(ARGV[6], ARGV[7], ended)
if e == nil then return {status, '', ended} end
return {'ok', e.epoch, ended}
