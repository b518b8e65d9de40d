-- KEYS: log, seen (earlier versions' Set), state, records (before anchoring), anchored,
--       positions, used, segments, packing
-- ARGV: bounds, the counts of messages, events and fields, anchor_json ('' to keep the
--       anchor), reached anchors ("\n" apart), now (ms), seen key prefix, segment key prefix;
--       then eight arguments a message, then the plain events' JSON, then field, value, field,
--       value... (the attributes to set: a value may hold any byte).
--   bounds: ttl_ms, max_log_events, read_pack_at_bytes (0: never), segment_ttl_ms,
--   max_log_bytes, records_ttl_ms, 8 bytes each, big-endian (redis_forms.packed_bounds; one
--   struct.unpack, where splitting them as text cost the script as much as a message), fixed
--   per store.
--   a message: its hash, its seen Set and member, its content_key, its seen Set and member
--   ('' when none), by_content ('1' or '0'), its event's JSON (redis_forms.message_arguments).
--   Each value its own argument: Redis hands them to Lua as strings, where decoding JSON or
--   splitting a packed argument in Lua cost the script more than all its calls into Redis
--   (docs/perf.md); the proxy packs a command of bytes in one C call (store/redis_packing.py).
-- Logs each message whose chain hash is new (and, by_content, whose content is new too),
-- marking both keys seen; then the plain events; sets the attributes and the meter anchor,
-- keeps the log to max_log_events and max_log_bytes (lua/log.lua); notes the record anchors
-- the request reached, and drops (a bounded number of) those no request reached for
-- records_ttl_ms. When the stream's unpacked bytes reach read_pack_at_bytes, claims the log's
-- pack (`packing`, for 10 s) unless another caller holds it.
-- Returns {added, dropped, oldest, tail_bytes, claimed, marks, epoch, first, id*}: how many
-- messages were new, the bytes of events dropped for the byte bound, the ordinal of the
-- stream's oldest entry, its unpacked bytes, 1 if the pack is this caller's, one character a
-- message ('1' logged, '0' not), then the ordinals' epoch, the ordinal of the first entry
-- logged and their ids (lua/log.lua).
-- A request's record after its answer is one call; so is a plain append.
local ttl, max_events, read_pack_at, segment_ttl, max_log_bytes, records_ttl =
  struct.unpack('>i8i8i8i8i8i8', ARGV[1])
local ttl_arg, segment_ttl_arg = as_int(ttl), as_int(segment_ttl)  -- the expiries as text
local legacy = redis.call('EXISTS', KEYS[2]) == 1 and KEYS[2] or nil
local seen, prefix = ARGV[8], ARGV[9]
local first_event = 10 + 8 * tonumber(ARGV[2])
local first_field = first_event + tonumber(ARGV[3])
local added = 0
local marks = {}
for at = 10, first_event - 1, 8 do
  local content_key = ARGV[at + 3]
  local new = seen_mark(seen, legacy, ARGV[at], ARGV[at + 1], ARGV[at + 2])
  if new and content_key ~= '' then
    local content_new = seen_mark(seen, legacy, content_key, ARGV[at + 4], ARGV[at + 5])
    if ARGV[at + 6] == '1' then new = content_new end
  end
  if new then
    log_event(KEYS[1], KEYS[3], ARGV[at + 7])
    added = added + 1
  end
  marks[#marks + 1] = new and '1' or '0'
end
for at = first_event, first_field - 1 do log_event(KEYS[1], KEYS[3], ARGV[at]) end
local logged = added + first_field - first_event
-- The attributes and the anchor, set with the log's own fields (one HSET: `logged_reply`).
local fields = {unpack(ARGV, first_field, first_field + tonumber(ARGV[4]) - 1)}
if ARGV[5] ~= '' then
  fields[#fields + 1], fields[#fields + 2] = 'anchor', ARGV[5]
end
-- The records' keys exist once the conversation compacted: until then one EXISTS, and
-- nothing here to note, drop or renew.
local compacted = redis.call('EXISTS', KEYS[4], KEYS[5], KEYS[6], KEYS[7]) > 0
if compacted and (ARGV[6] ~= '' or redis.call('EXISTS', KEYS[7]) == 1) then
  local now = now_ms()
  for field in string.gmatch(ARGV[6], '[^\n]+') do
    if redis.call('HEXISTS', KEYS[5], field) == 1 then
      redis.call('ZADD', KEYS[7], as_int(now), field)
    end
  end
  local unused = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now - records_ttl, 'LIMIT', 0, 64)
  for _, field in ipairs(unused) do
    drop_anchor(KEYS[5], KEYS[6], KEYS[7], field)
  end
end
seen_save(segment_ttl_arg)
local dropped = 0
if logged > 0 then
  dropped = bound_log(KEYS[1], KEYS[3], KEYS[8], prefix, max_log_bytes, max_events)
end
local log = log_state(KEYS[1], KEYS[3])
if renewal_due(KEYS[1], KEYS[3], tonumber(ARGV[7]), ttl) then
  renew_segments(KEYS[8], prefix, segment_ttl_arg)
  renew_seen(seen, segment_ttl_arg, 2 * max_events)
end
local claimed = 0
if logged > 0 and read_pack_at > 0 and log.tail_bytes >= read_pack_at then
  if redis.call('SET', KEYS[9], '1', 'NX', 'PX', 10000) then claimed = 1 end
end
local reply = logged_reply(KEYS[3], 0, fields)
redis.call('PEXPIRE', KEYS[1], ttl_arg)  -- not the Set `seen`: it is left to expire
redis.call('PEXPIRE', KEYS[3], ttl_arg)
redis.call('PEXPIRE', KEYS[8], ttl_arg)
if compacted then  -- nothing above creates a records key
  local records_ttl_arg = as_int(records_ttl)
  for k = 4, 7 do redis.call('PEXPIRE', KEYS[k], records_ttl_arg) end
end
local head = {added, dropped, log.oldest, log.tail_bytes, claimed, table.concat(marks)}
for k = 2, #reply do head[#head + 1] = reply[k] end
return head
