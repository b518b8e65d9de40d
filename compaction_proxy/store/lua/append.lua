-- KEYS: log, seen (earlier versions' Set), state, records (before anchoring), anchored,
--       positions, used, segments, packing
-- ARGV: bounds, messages, blob, events, attributes, anchor_json ('' to keep the anchor),
--       reached anchors ("\n" apart), now (ms), seen key prefix, segment key prefix
--   bounds: ttl_ms, max_log_events, read_pack_at_bytes (0: never), segment_ttl_ms,
--   max_log_bytes, records_ttl_ms, 8 bytes each, big-endian (redis_forms.packed_bounds; one
--   struct.unpack, where splitting them as text cost the script as much as a message), fixed
--   per store.
--   messages: JSON array of [hash, its seen Set and member, content_key, its seen Set and
--   member ('' when none), by_content (0/1), length in bytes] (redis_forms.seen_member); blob:
--   those events' JSON back to back. events: the plain events' JSON; attributes: field,
--   value, field, value...; each as its length in 4 bytes (big-endian) and its bytes, back
--   to back (redis_forms.length_prefixed: a value may hold any byte).
--   A handful of arguments however many messages, events and attributes: redis-py packs each
--   argument alone, and a request logging 20,000 messages would otherwise spend far longer
--   packing 80,000 arguments than Redis spends running this script.
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
-- One struct.unpack a value (a C call: a loop of string.find and string.sub cost the script
-- about a tenth of its time).
local function pieces(packed)
  local out, at, size = {}, 1, #packed
  while at <= size do
    out[#out + 1], at = struct.unpack('>I4c0', packed, at)
  end
  return out
end
local ttl, max_events, read_pack_at, segment_ttl, max_log_bytes, records_ttl =
  struct.unpack('>i8i8i8i8i8i8', ARGV[1])
local ttl_arg, segment_ttl_arg = as_int(ttl), as_int(segment_ttl)  -- the expiries as text
local legacy = redis.call('EXISTS', KEYS[2]) == 1 and KEYS[2] or nil
local seen, prefix = ARGV[9], ARGV[10]
local added = 0
local marks = {}
local blob, offset = ARGV[3], 1
for _, m in ipairs(cjson.decode(ARGV[2])) do
  local hash, content_key, by_content, length = m[1], m[4], m[7], m[8]
  -- A new hash is marked seen even when its content was (by_content: not logged); a message
  -- is only ever left unlogged as a duplicate, so the mark changes nothing it decides.
  local new = seen_mark(seen, legacy, hash, m[2], m[3])
  if new and content_key ~= '' then
    local content_new = seen_mark(seen, legacy, content_key, m[5], m[6])
    if by_content == 1 then new = content_new end
  end
  if new then
    log_event(KEYS[1], KEYS[3], string.sub(blob, offset, offset + length - 1))
    added = added + 1
  end
  marks[#marks + 1] = new and '1' or '0'
  offset = offset + length
end
local events = pieces(ARGV[4])
for _, event in ipairs(events) do log_event(KEYS[1], KEYS[3], event) end
local logged = added + #events
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[3], unpack(pieces(ARGV[5])))
end
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[3], 'anchor', ARGV[6])
end
if ARGV[7] ~= '' or redis.call('EXISTS', KEYS[7]) == 1 then
  local now = now_ms()
  for field in string.gmatch(ARGV[7], '[^\n]+') do
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
if renewal_due(KEYS[1], KEYS[3], tonumber(ARGV[8]), ttl) then
  renew_segments(KEYS[8], prefix, segment_ttl_arg)
  renew_seen(seen, segment_ttl_arg, 2 * max_events)
end
local claimed = 0
if logged > 0 and read_pack_at > 0 and log.tail_bytes >= read_pack_at then
  if redis.call('SET', KEYS[9], '1', 'NX', 'PX', 10000) then claimed = 1 end
end
local reply = logged_reply(KEYS[3], 0)
redis.call('PEXPIRE', KEYS[1], ttl_arg)  -- not the Set `seen`: it is left to expire
redis.call('PEXPIRE', KEYS[3], ttl_arg)
redis.call('PEXPIRE', KEYS[8], ttl_arg)
-- The records' keys exist once the conversation compacted: until then one EXISTS, no PEXPIRE.
if redis.call('EXISTS', KEYS[4], KEYS[5], KEYS[6], KEYS[7]) > 0 then
  local records_ttl_arg = as_int(records_ttl)
  for k = 4, 7 do redis.call('PEXPIRE', KEYS[k], records_ttl_arg) end
end
local head = {added, dropped, log.oldest, log.tail_bytes, claimed, table.concat(marks)}
for k = 2, #reply do head[#head + 1] = reply[k] end
return head
