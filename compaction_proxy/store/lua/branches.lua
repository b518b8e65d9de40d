-- Prepended to every script that reads a branch (see store/branches.py for the model).
-- A chain arrives as two arguments: its hashes back to back, each `width` characters, and
-- `width`; width 0 stands for the whole conversation. Records are kept in the hash
-- `anchored`, field "<position>:<hash>" -> lines "<order> <record JSON>" ("\n" apart; order =
-- generation * 65536 + index in its commit), and a line "<order>" alone for the last commit
-- that dropped records there (so a branch's generation never goes back); `positions` counts the fields at each
-- position; `used` holds when a request last reached each field; `leases` maps each owner
-- to "<position>:<hash>:<expires ms>" (position -1: the whole conversation).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function chain_holds(blob, width, position, hash)
  if width == 0 or position < 0 then return true end
  if (position + 1) * width > #blob then return false end
  return string.sub(blob, position * width + 1, (position + 1) * width) == hash
end

-- The field values of the records anchored on the chain.
local function branch_values(anchored, positions, blob, width)
  if width == 0 then return redis.call('HVALS', anchored) end
  local values, count = {}, #blob / width
  for _, p in ipairs(redis.call('HKEYS', positions)) do
    local position = tonumber(p)
    if position < count then
      local field = p .. ':' .. string.sub(blob, position * width + 1, (position + 1) * width)
      local value = redis.call('HGET', anchored, field)
      if value then values[#values + 1] = value end
    end
  end
  return values
end

-- The newest generation among those values (of the whole conversation: its counter); a
-- conversation that still holds records from before they were anchored counts its counter.
local function branch_generation(state, legacy, anchored, positions, blob, width)
  local stored = redis.call('HGET', state, 'generation') or '0'
  -- An unreadable counter (damaged, or another version's) counts as 0, as the proxy reads it.
  local counter = string.match(stored, '^%d+$') and tonumber(stored) or 0
  if width == 0 or redis.call('LLEN', legacy) > 0 then return counter end
  local newest = 0
  for _, value in ipairs(branch_values(anchored, positions, blob, width)) do
    for order in string.gmatch(value, '(%d+)[^\n]*') do
      local generation = math.floor(tonumber(order) / 65536)
      if generation > newest then newest = generation end
    end
  end
  return newest
end

-- The owner of a live lease on the chain (or false) and the position its compaction ends at;
-- expired leases are dropped when `prune`.
local function lease_on(leases, blob, width, now, prune)
  local entries = redis.call('HGETALL', leases)
  local found, position = false, false
  for i = 1, #entries, 2 do
    local p, hash, expires = string.match(entries[i + 1], '^(-?%d+):(.*):(%d+)$')
    if not p or tonumber(expires) <= now then
      if prune then redis.call('HDEL', leases, entries[i]) end
    elseif not found and chain_holds(blob, width, tonumber(p), hash) then
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

