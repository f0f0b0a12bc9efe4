-- The executor socket this node held ended. ARGV[6..9]: environment, epoch, '1' when the
-- executor left for good (close 1000), this node. A node that has lost the environment to
-- another changes nothing. Returns the registrations ended.
local id, epoch, left, node = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local ended = {}
local e = load(id)
if e == nil or e.epoch ~= epoch or e.attached ~= '1' or e.owner ~= node then return ended end
if left == '1' then
  remove(id, e, 'executor_left', ended)
  return ended
end
redis.call('HSET', env_key(id), 'attached', '0', 'detached', NOW)
redis.call('ZADD', P .. 'due', NOW + TTL, id)
return ended
