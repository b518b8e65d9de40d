-- Prepended to every script that reads a branch (see store/branches.py for the model).
-- A chain arrives in one of two forms (store/redis_forms.py). Whole: its hashes back to back,
-- each `width` characters, and `width` (`blob_chain`; width 0 stands for the whole
-- conversation). Picked: its length and its hashes at the positions the caller picked only
-- (`picked_chain`), so that what a request sends does not grow with its conversation. In
-- Lua a chain is a table (nil: the whole conversation); a picked one notes every position a
-- script consulted, and those it did not hold (`missing`): the script then answers for the
-- caller to ask again with them. Records are kept in the hash
-- `anchored`, field "<position>:<hash>" -> lines "<order> <record JSON>" ("\n" apart; order =
-- generation * 65536 + index in its commit), and a line "<order>" alone for the last commit
-- that dropped records there (so a branch's generation never goes back); `positions` counts the fields at each
-- position; `used` holds when a request last reached each field; `leases` maps each owner
-- to "<position>:<hash>:<expires ms>" (position -1: the whole conversation).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function blob_chain(blob, width)
  if width == 0 then return nil end
  return {count = math.floor(#blob / width), blob = blob, width = width}
end

-- `count` '' stands for the whole conversation; `picks`: "<position>:<hash>" space apart.
local function picked_chain(count, picks)
  if count == '' then return nil end
  local hashes = {}
  for position, hash in string.gmatch(picks, '(%d+):(%S+)') do
    hashes[tonumber(position)] = hash
  end
  return {count = tonumber(count), hashes = hashes, consulted = {}, missing = {}}
end

-- The chain's hash at a position inside it; nil where a picked chain was not given one.
local function hash_at(chain, position)
  if chain.blob then
    return string.sub(chain.blob, position * chain.width + 1, (position + 1) * chain.width)
  end
  chain.consulted[#chain.consulted + 1] = position
  local hash = chain.hashes[position]
  if not hash then chain.missing[#chain.missing + 1] = position end
  return hash
end

local function chain_holds(chain, position, hash)
  if chain == nil or position < 0 then return true end
  if position >= chain.count then return false end
  return hash_at(chain, position) == hash
end

-- The field values of the records anchored on the chain.
local function branch_values(anchored, positions, chain)
  if chain == nil then return redis.call('HVALS', anchored) end
  local values = {}
  for _, p in ipairs(redis.call('HKEYS', positions)) do
    local position = tonumber(p)
    if position < chain.count then
      local hash = hash_at(chain, position)
      local value = hash and redis.call('HGET', anchored, p .. ':' .. hash)
      if value then values[#values + 1] = value end
    end
  end
  return values
end

-- The newest generation among those values (of the whole conversation: its counter); a
-- conversation that still holds records from before they were anchored counts its counter.
local function branch_generation(state, legacy, anchored, positions, chain)
  local stored = redis.call('HGET', state, 'generation') or '0'
  -- An unreadable counter (damaged, or another version's) counts as 0, as the proxy reads it.
  local counter = string.match(stored, '^%d+$') and tonumber(stored) or 0
  if chain == nil or redis.call('LLEN', legacy) > 0 then return counter end
  local newest = 0
  for _, value in ipairs(branch_values(anchored, positions, chain)) do
    for order in string.gmatch(value, '(%d+)[^\n]*') do
      local generation = math.floor(tonumber(order) / 65536)
      if generation > newest then newest = generation end
    end
  end
  return newest
end

-- The owner of a live lease on the chain (or false) and the position its compaction ends at;
-- expired leases are dropped when `prune`. Every live lease's position is consulted, so that
-- one answer names all that a picked chain lacks. `now` (ms) is read from the clock when nil
-- and some lease is held (most conversations hold none: no TIME call).
local function lease_on(leases, chain, now, prune)
  local entries = redis.call('HGETALL', leases)
  local found, position = false, false
  if #entries > 0 and not now then now = now_ms() end
  for i = 1, #entries, 2 do
    local p, hash, expires = string.match(entries[i + 1], '^(-?%d+):(.*):(%d+)$')
    if not p or tonumber(expires) <= now then
      if prune then redis.call('HDEL', leases, entries[i]) end
    elseif chain_holds(chain, tonumber(p), hash) and not found then
      found, position = entries[i], p
    end
  end
  return found, position
end

-- Forget one anchor's field and its bookkeeping.
local function drop_anchor(anchored, positions, used, field)
  redis.call('HDEL', anchored, field)
  redis.call('ZREM', used, field)
  local p = string.match(field, '^(%d+):')
  if p and redis.call('HINCRBY', positions, p, -1) <= 0 then
    redis.call('HDEL', positions, p)
  end
end

