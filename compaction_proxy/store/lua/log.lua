-- Prepended to every script that writes the log (see store/log_segments.py for the model).
-- Events go to the stream as plain JSON (field 'e'), each numbered with the conversation's
-- next ordinal. The state hash holds `logged` (the last ordinal given), `oldest` (the
-- ordinal of the stream's oldest entry), the bytes the log holds (`log_bytes`), those not
-- packed yet (`tail_bytes`), the events in segments (`packed_events`), and when the segments'
-- keys last had their expiry renewed (`renewed`), and the `epoch` these ordinals count in: a
-- state started afresh (a Redis that lost its data, a log whose state expired) starts a new
-- epoch, so no ordinal a replica remembers is taken for a new entry's. A script reads these fields once
-- (`log_state`) and writes them once (`logged_reply`): every call from Lua into Redis costs
-- about a microsecond, more than the rest of an append's bookkeeping.
-- The reply names the ordinal of the first entry a script added, and their ids, so the
-- caller can tell which of the stream's entries are its own.
local LOG, LOGGED, LOGGED_FIRST = nil, {}, 0
local LOG_FIELDS = {
  'log_bytes', 'tail_bytes', 'packed_events', 'logged', 'oldest', 'renewed', 'epoch',
}

-- A whole number as a command's argument. Redis 7.0 writes a Lua number given to a command
-- with printf's "%.17g", whose float path costs over a thousand instructions; "%d" a fraction
-- of that, for the same text.
local function as_int(n)
  return string.format('%d', n)
end

local function log_state(log, state)
  if LOG then return LOG end
  local values = redis.call('HMGET', state, unpack(LOG_FIELDS))
  LOG = {
    log_bytes = tonumber(values[1]) or 0,
    tail_bytes = tonumber(values[2]) or 0,
    packed_events = tonumber(values[3]) or 0,
    logged = tonumber(values[4]),
    oldest = tonumber(values[5]),
    renewed = tonumber(values[6]) or 0,
    epoch = values[7],
  }
  if not LOG.logged or not LOG.oldest or not LOG.epoch then
    -- a new state, or a log earlier versions wrote: its entries are 1..n of a new epoch
    LOG.logged, LOG.oldest, LOG.epoch = redis.call('XLEN', log), 1, tostring(now_ms())
    LOG.dirty = true
  end
  return LOG
end

local function log_event(log, state, value)
  local s = log_state(log, state)
  s.logged = s.logged + 1
  if LOGGED_FIRST == 0 then LOGGED_FIRST = s.logged end
  LOGGED[#LOGGED + 1] = redis.call('XADD', log, '*', 'e', value)
  s.log_bytes = s.log_bytes + #value
  s.tail_bytes = s.tail_bytes + #value
  s.dirty = true
end

-- Writes the state fields back, with `fields` (other fields of the state: field, value...,
-- or nil) in the same HSET; the reply: the script's result, the epoch, the ordinal of the
-- first entry it added (0: none), their ids.
local function logged_reply(state, result, fields)
  fields = fields or {}
  if LOG and LOG.dirty then
    local n = #fields
    fields[n + 1], fields[n + 2] = 'log_bytes', as_int(math.max(LOG.log_bytes, 0))
    fields[n + 3], fields[n + 4] = 'tail_bytes', as_int(math.max(LOG.tail_bytes, 0))
    fields[n + 5], fields[n + 6] = 'packed_events', as_int(math.max(LOG.packed_events, 0))
    fields[n + 7], fields[n + 8] = 'logged', as_int(LOG.logged)
    fields[n + 9], fields[n + 10] = 'oldest', as_int(LOG.oldest)
    fields[n + 11], fields[n + 12] = 'renewed', as_int(LOG.renewed)
    fields[n + 13], fields[n + 14] = 'epoch', LOG.epoch
    LOG.dirty = false
  end
  if #fields > 0 then redis.call('HSET', state, unpack(fields)) end
  return {result, LOG and LOG.epoch or '', LOGGED_FIRST, unpack(LOGGED)}
end

-- A segment's key, from the prefix the caller names and the token ending its index line.
local function segment_key(prefix, line)
  return prefix .. (string.match(line, '(%S+)$') or '')
end

-- Whether the keys that are not renewed by every append (the segments', and the seen Sets an
-- append does not touch) are due to be: once a quarter of the log's expiry has passed since
-- they last were. Their expiry is a quarter more than the log's, so a live log's keys outlive
-- it, and no append pays for a key a segment.
local function renewal_due(log, state, now, ttl)
  local s = log_state(log, state)
  if now - s.renewed < ttl / 4 then return false end
  s.renewed, s.dirty = now, true
  return true
end

local function renew_segments(segments, prefix, segment_ttl)
  for _, line in ipairs(redis.call('LRANGE', segments, 0, -1)) do
    redis.call('PEXPIRE', segment_key(prefix, line), segment_ttl)
  end
end

-- Seen keys (which messages are logged already), as store/redis_forms.py `seen_member`
-- gives them: a key's last 13 hex digits as an integer, in one of 8 Sets of its kind. Redis
-- keeps a Set of at most 512 integers as a sorted array, 8 bytes a key, where a Set of the
-- keys' text spent about 90. Only the Sets an append touches have their expiry renewed then;
-- `renew_seen` renews all of them now and then, and starts afresh any past `most` keys
-- (seen keys only deduplicate logging: the worst case is a message logged twice). The Set
-- `legacy` that earlier versions kept is still read while it lives.
local SEEN_TOUCHED, SEEN_KINDS, SEEN_SETS = {}, {'', 'd:'}, 8

-- Marks a key seen, and answers whether it was not seen before: one SADD does both (a Set
-- that gains the key has its expiry renewed by `seen_save`).
local function seen_mark(prefix, legacy, key, set, member)
  local name = prefix .. set
  if redis.call('SADD', name, member) == 0 then return false end
  SEEN_TOUCHED[name] = true
  return not (legacy and redis.call('SISMEMBER', legacy, key) == 1)
end

local function seen_save(ttl)
  for set in pairs(SEEN_TOUCHED) do redis.call('PEXPIRE', set, ttl) end
end

local function renew_seen(prefix, ttl, most)
  for _, kind in ipairs(SEEN_KINDS) do
    for bucket = 0, SEEN_SETS - 1 do
      local set = prefix .. kind .. bucket
      if redis.call('SCARD', set) > most / SEEN_SETS then redis.call('DEL', set) end
      redis.call('PEXPIRE', set, ttl)
    end
  end
end

-- Drops the log's oldest events while it holds more than `max_bytes` or `max_events`: whole
-- segments first (a segment goes for the event bound only while as many events remain), then
-- stream entries; the newest event always stays. Returns the bytes dropped for the byte bound.
local function bound_log(log, state, segments, prefix, max_bytes, max_events)
  local s = log_state(log, state)
  local count = redis.call('XLEN', log) + s.packed_events
  local dropped = 0
  while (s.log_bytes > max_bytes or count > max_events) and count > 1 do
    local oldest = redis.call('LINDEX', segments, 0)
    if oldest then
      local events, stored = string.match(oldest, '^%S+ %S+ (%d+) (%d+)')
      events, stored = tonumber(events) or 0, tonumber(stored) or 0
      if s.log_bytes <= max_bytes and count - events < max_events then break end
      redis.call('LPOP', segments)
      redis.call('DEL', segment_key(prefix, oldest))
      if s.log_bytes > max_bytes then dropped = dropped + stored end
      s.log_bytes, count = s.log_bytes - stored, count - events
      s.packed_events = s.packed_events - events
    else
      local entries = redis.call('XRANGE', log, '-', '+', 'COUNT', 64)
      local ids = {}
      for _, entry in ipairs(entries) do
        if (s.log_bytes <= max_bytes and count <= max_events) or count <= 1 then break end
        local size = #entry[2][2]
        if s.log_bytes > max_bytes then dropped = dropped + size end
        s.log_bytes, s.tail_bytes, count = s.log_bytes - size, s.tail_bytes - size, count - 1
        ids[#ids + 1] = entry[1]
      end
      if #ids == 0 then break end
      redis.call('XDEL', log, unpack(ids))
      s.oldest = s.oldest + #ids
    end
    s.dirty = true
  end
  return dropped
end
