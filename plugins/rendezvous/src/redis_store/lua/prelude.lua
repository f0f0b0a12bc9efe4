-- Shared by every script of the Redis rendezvous store (prepended to each). ARGV[1] is the
-- key prefix; ARGV[2..5] the grace, the registration TTL, the attach timeout and the node
-- lease, in milliseconds. Every time comes from the Redis server's clock (TIME), never from
-- a node's, so nodes whose clocks disagree still agree on every deadline.
--
-- P .. 'env:' .. id       hash: reg, key, tenant, created, epoch, attached, ever, detached,
--                          owner (public URL of the node holding the executor socket),
--                          lease (until when that node vouches for the socket)
-- P .. 'replaced:' .. id  list: the latest replaced registration ids (upgrade -> 410)
-- P .. 'due'              sorted set: environment id by the time its registration is due
-- P .. 'count:environments', P .. 'count:tenant:' .. name   environments held
-- P .. 'epoch'            counter: the epoch of the last registration installed
local P = ARGV[1]
local GRACE = tonumber(ARGV[2])
local TTL = tonumber(ARGV[3])
local ATTACH = tonumber(ARGV[4])
local LEASE = tonumber(ARGV[5])
local REPLACED_IDS = 64

local NOW = (function()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end)()

local function env_key(id) return P .. 'env:' .. id end

local function load(id)
  local flat = redis.call('HGETALL', env_key(id))
  if #flat == 0 then return nil end
  local e = {}
  for i = 1, #flat, 2 do e[flat[i]] = flat[i + 1] end
  return e
end

-- An executor socket is open on a node whose heartbeat still vouches for it.
local function attached(e)
  return e.attached == '1' and tonumber(e.lease) > NOW
end

-- Since when the executor is away: its detach, or the end of its node's last lease (a
-- node that died never reports the detach).
local function away_since(e)
  if e.attached == '1' then return tonumber(e.lease) end
  return tonumber(e.detached)
end

local function within_grace(e)
  if attached(e) then return true end
  if e.ever ~= '1' then return false end
  return NOW - away_since(e) < GRACE
end

-- When the registration is due to be deleted, and why.
local function deadline(e)
  if e.ever ~= '1' then return tonumber(e.created) + ATTACH, 'attach_timeout' end
  return away_since(e) + TTL, 'registration_ttl'
end

local function schedule(id, e)
  local at = deadline(e)
  redis.call('ZADD', P .. 'due', at, id)
end

-- The one way a registration ends with its environment; its capacity is given back.
local function remove(id, e, why, ended)
  redis.call('DEL', env_key(id), P .. 'replaced:' .. id)
  redis.call('ZREM', P .. 'due', id)
  redis.call('DECR', P .. 'count:environments')
  redis.call('DECR', P .. 'count:tenant:' .. e.tenant)
  table.insert(ended, {id, e.epoch, why})
end

-- The environment's registration, deleted first when it is due: expiry never waits for
-- the sweep.
local function current(id, ended)
  local e = load(id)
  if e == nil then return nil end
  local at, why = deadline(e)
  if at <= NOW then
    remove(id, e, why, ended)
    return nil
  end
  return e
end

-- Deletes up to `limit` registrations that are due.
local function sweep(limit, ended)
  local ids = redis.call('ZRANGEBYSCORE', P .. 'due', '-inf', NOW, 'LIMIT', 0, limit)
  for _, id in ipairs(ids) do
    local e = load(id)
    if e == nil then
      redis.call('ZREM', P .. 'due', id)
    else
      local at, why = deadline(e)
      if at <= NOW then remove(id, e, why, ended) else schedule(id, e) end
    end
  end
end

-- Upgrade checks 5-7 of RELAY 8.4: the registration exists and is the current one.
local function upgrade_target(id, reg, ended)
  local e = current(id, ended)
  if e == nil then return nil, '404' end
  if e.reg == reg then return e, nil end
  if redis.call('LPOS', P .. 'replaced:' .. id, reg) then return nil, '410' end
  return nil, '404'
end

local function count(key) return tonumber(redis.call('GET', key) or '0') end
