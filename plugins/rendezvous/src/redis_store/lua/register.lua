-- register (RELAY 8.2). ARGV[6..11]: environment, registration id, executor key (JSON),
-- tenant, the service's and the tenant's environment limits.
-- Returns {'ok' | 'busy' | 'tenant_full' | 'service_full', registration id, ended}.
local id, reg, key, tenant = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local MAX, TENANT_MAX = tonumber(ARGV[10]), tonumber(ARGV[11])
local ended = {}
local tenant_count = P .. 'count:tenant:' .. tenant

local function install()
  local epoch = redis.call('INCR', P .. 'epoch')
  redis.call('HSET', env_key(id), 'reg', reg, 'key', key, 'tenant', tenant,
    'created', NOW, 'epoch', epoch, 'attached', '0', 'ever', '0', 'detached', '0',
    'owner', '', 'lease', '0')
  redis.call('ZADD', P .. 'due', NOW + ATTACH, id)
end

local e = current(id, ended)
if e then
  if e.key == key then
    -- The key is public: only the tenant that registered it gets it again.
    if e.tenant == tenant then return {'ok', e.reg, ended} end
    return {'busy', '', ended}
  end
  -- A restarted executor of the same tenant takes over when no executor socket is open;
  -- anyone else waits while the current executor is live.
  local restart = e.tenant == tenant and not attached(e)
  local live = within_grace(e) or (e.ever ~= '1' and NOW - tonumber(e.created) < GRACE)
  if live and not restart then return {'busy', '', ended} end
  if e.tenant ~= tenant then
    if count(tenant_count) >= TENANT_MAX then return {'tenant_full', '', ended} end
    redis.call('INCR', tenant_count)
    redis.call('DECR', P .. 'count:tenant:' .. e.tenant)
  end
  table.insert(ended, {id, e.epoch, 'replaced'})
  local replaced = P .. 'replaced:' .. id
  redis.call('LREM', replaced, 0, reg)
  redis.call('LPUSH', replaced, e.reg)
  redis.call('LTRIM', replaced, 0, REPLACED_IDS - 1)
  install()
  return {'ok', reg, ended}
end

-- The tenant's limit is checked first, so a tenant at its own limit is told so.
local function full()
  if count(tenant_count) >= TENANT_MAX then return 'tenant_full' end
  if count(P .. 'count:environments') >= MAX then return 'service_full' end
  return nil
end
if full() then
  -- Full, but something may be due: free it first, then decide.
  sweep(64, ended)
  local refused = full()
  if refused then return {refused, '', ended} end
end
redis.call('INCR', tenant_count)
redis.call('INCR', P .. 'count:environments')
install()
return {'ok', reg, ended}
