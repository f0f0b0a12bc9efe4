-- This node still has sockets of these environments. ARGV[6]: this node; then triples of
-- environment, epoch and '1' when the node holds the executor socket ('0': only harness
-- sockets or parked routes). The lease on held executor sockets is renewed. Returns
-- {environment, 'moved' | 'ended'} for each environment whose executor is held by another
-- node now, or whose registration ended.
local node = ARGV[6]
local lost = {}
for i = 7, #ARGV - 2, 3 do
  local id, epoch, executor = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local e = load(id)
  if e == nil or tonumber(e.epoch) > tonumber(epoch) then
    table.insert(lost, {id, 'ended'})
  elseif tonumber(e.epoch) < tonumber(epoch) then
    -- This node already serves a newer registration than the store knows; nothing to do.
  elseif e.owner ~= node and e.owner ~= '' then
    table.insert(lost, {id, 'moved'})
  elseif executor == '1' then
    -- Attached here, whatever a late report of an earlier socket's end recorded.
    redis.call('HSET', env_key(id), 'attached', '1', 'ever', '1', 'owner', node,
      'lease', NOW + LEASE)
    redis.call('ZADD', P .. 'due', NOW + LEASE + TTL, id)
  end
end
return lost
