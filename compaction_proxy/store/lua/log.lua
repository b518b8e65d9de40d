-- Prepended to every script that writes the log (see store/log_segments.py for the model).
-- Events go to the stream as plain JSON (field 'e'); their bytes are counted in the state's
-- `log_bytes` (all the log holds) and `tail_bytes` (what is not packed yet). The ids a script
-- adds are collected, with the stream's newest id before the first of them, and returned by
-- `logged_reply`, so the caller can tell whether they follow the entries it logged itself.
local LOGGED, LOGGED_AFTER, LOGGED_BYTES = {}, nil, 0

local function log_event(log, value)
  if LOGGED_AFTER == nil then
    local newest = redis.call('XREVRANGE', log, '+', '-', 'COUNT', 1)
    LOGGED_AFTER = newest[1] and newest[1][1] or ''
  end
  LOGGED[#LOGGED + 1] = redis.call('XADD', log, '*', 'e', value)
  LOGGED_BYTES = LOGGED_BYTES + #value
end

-- Counts what was logged in the state hash; the reply: the script's result, the stream's
-- newest id before this script's entries ('' when none were added or it was empty), their ids.
local function logged_reply(state, result)
  if LOGGED_BYTES > 0 then
    redis.call('HINCRBY', state, 'log_bytes', LOGGED_BYTES)
    redis.call('HINCRBY', state, 'tail_bytes', LOGGED_BYTES)
  end
  return {result, LOGGED_AFTER or '', unpack(LOGGED)}
end

-- Seen keys (which messages are logged already) kept in 16 buckets of one Hash, 16
-- characters a key back to back: a Set spent about 90 bytes a key. A key is its last 16
-- characters (a hash or digest's: 64 bits, never alike by chance within one conversation).
-- The Set `legacy` that earlier versions kept is still read while it lives.
local function seen_slot(key)
  local k = #key >= 16 and string.sub(key, -16) or string.rep(' ', 16 - #key) .. key
  return string.format('%x', string.byte(k, 16) % 16), k
end

local function seen_has(buckets, legacy, key)
  local field, k = seen_slot(key)
  local bucket = redis.call('HGET', buckets, field)
  if bucket then
    local at = 1
    while true do
      local found = string.find(bucket, k, at, true)
      if not found then break end
      if (found - 1) % 16 == 0 then return true end
      at = found + 1
    end
  end
  return legacy and redis.call('SISMEMBER', legacy, key) == 1
end

-- Marks `key` seen; a bucket past `most` keys is started afresh (seen keys only deduplicate
-- logging: the worst case is a message logged twice).
local function seen_add(buckets, key, most)
  local field, k = seen_slot(key)
  local bucket = redis.call('HGET', buckets, field) or ''
  if #bucket >= most * 16 then bucket = '' end
  redis.call('HSET', buckets, field, bucket .. k)
end

-- Drops the log's oldest events while it holds more than `max_bytes` or `max_events`: whole
-- segments first (a segment goes for the event bound only while as many events remain), then
-- stream entries; the newest event always stays. Returns the bytes dropped for the byte bound.
local function bound_log(log, state, packed, segments, max_bytes, max_events)
  local held = tonumber(redis.call('HGET', state, 'log_bytes') or '0') or 0
  local tail = tonumber(redis.call('HGET', state, 'tail_bytes') or '0') or 0
  local in_segments = tonumber(redis.call('HGET', state, 'packed_events') or '0') or 0
  local count = redis.call('XLEN', log) + in_segments
  local dropped = 0
  while (held > max_bytes or count > max_events) and count > 1 do
    local oldest = redis.call('LINDEX', segments, 0)
    if oldest then
      local events, stored = string.match(oldest, '^%S+ %S+ (%d+) (%d+)')
      events, stored = tonumber(events) or 0, tonumber(stored) or 0
      if held <= max_bytes and count - events < max_events then break end
      redis.call('LPOP', segments)
      redis.call('LPOP', packed)
      if held > max_bytes then dropped = dropped + stored end
      held, count, in_segments = held - stored, count - events, in_segments - events
    else
      local entries = redis.call('XRANGE', log, '-', '+', 'COUNT', 64)
      local ids = {}
      for _, entry in ipairs(entries) do
        if (held <= max_bytes and count <= max_events) or count <= 1 then break end
        local size = #entry[2][2]
        if held > max_bytes then dropped = dropped + size end
        held, tail, count = held - size, tail - size, count - 1
        ids[#ids + 1] = entry[1]
      end
      if #ids == 0 then break end
      redis.call('XDEL', log, unpack(ids))
    end
  end
  redis.call('HSET', state, 'log_bytes', math.max(held, 0), 'tail_bytes', math.max(tail, 0),
    'packed_events', math.max(in_segments, 0))
  return dropped
end
