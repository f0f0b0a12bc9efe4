-- This node still holds these executor sockets: their lease is renewed. ARGV[6]: this node;
-- then pairs of environment and epoch. Returns {environment, 'moved' | 'ended'} for each
-- the node no longer holds.
local node = ARGV[6]
local lost = {}
for i = 7, #ARGV - 1, 2 do
  local id, epoch = ARGV[i], ARGV[i + 1]
  local e = load(id)
  if e == nil or e.epoch ~= epoch then
    table.insert(lost, {id, 'ended'})
  elseif e.attached ~= '1' or e.owner ~= node then
    table.insert(lost, {id, 'moved'})
  else
    redis.call('HSET', env_key(id), 'lease', NOW + LEASE)
    redis.call('ZADD', P .. 'due', NOW + LEASE + TTL, id)
  end
end
return lost
