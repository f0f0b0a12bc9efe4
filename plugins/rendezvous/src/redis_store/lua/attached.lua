-- An executor socket opened on this node: it takes the environment over, from whichever
-- node held it before. ARGV[6..8]: environment, registration id, this node.
-- Returns the epoch, or '' when the registration is no longer current.
local id = ARGV[6]
local e = load(id)
if e == nil or e.reg ~= ARGV[7] then return '' end
redis.call('HSET', env_key(id), 'attached', '1', 'ever', '1', 'owner', ARGV[8],
  'lease', NOW + LEASE)
redis.call('ZADD', P .. 'due', NOW + LEASE + TTL, id)
return e.epoch
