-- KEYS: log, seen, state, records (before anchoring), anchored, positions, used
-- ARGV: ttl_ms, max_log_events, messages, blob, n_events, event*, n_attributes, (field, value)*,
--       anchor_json ('' to keep the anchor), reached anchors ("\n" apart), max_log_bytes,
--       records_ttl_ms
--   messages: JSON array of [hash, content_key, by_content (0/1), stored length in bytes,
--   compressed (0/1)]; blob: those events as stored (JSON, or zstd-compressed JSON kept in the
--   field 'z' instead of 'e': store/packed_events.py), back to back. Two arguments however
--   many messages: a request
--   logging 20,000 of them would otherwise spend far longer packing 80,000 arguments than
--   Redis spends running this script.
-- Logs each message whose chain hash is new (and, by_content, whose content is new too),
-- marking both keys seen; then the plain events; sets the attributes and the meter anchor,
-- keeps the log to max_log_events and max_log_bytes (the bytes it logs are counted in the state
-- field `log_bytes`; the oldest events go first, the newest always stays); notes the record
-- anchors the request reached, and drops (a bounded number of) those no request reached for
-- records_ttl_ms. Returns how many messages were new, and the bytes of events dropped for the
-- byte bound.
-- A request's record after its answer is one call; so is a plain append.
local ttl = ARGV[1]
local max_events = tonumber(ARGV[2])
local added, logged_bytes = 0, 0
local blob, offset = ARGV[4], 1
for _, m in ipairs(cjson.decode(ARGV[3])) do
  local hash, content_key, by_content, length = m[1], m[2], m[3], m[4]
  local field = m[5] == 1 and 'z' or 'e'
  local new = redis.call('SISMEMBER', KEYS[2], hash) == 0
  if new and by_content == 1 and content_key ~= '' then
    new = redis.call('SISMEMBER', KEYS[2], content_key) == 0
  end
  if new then
    redis.call('SADD', KEYS[2], hash)
    if content_key ~= '' then redis.call('SADD', KEYS[2], content_key) end
    redis.call('XADD', KEYS[1], '*', field, string.sub(blob, offset, offset + length - 1))
    added = added + 1
    logged_bytes = logged_bytes + length
  end
  offset = offset + length
end
local i = 5
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
  logged_bytes = logged_bytes + #ARGV[i]
  i = i + 1
end
local logged = added + n
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
if ARGV[i] ~= '' then
  redis.call('HSET', KEYS[3], 'anchor', ARGV[i])
end
local records_ttl = tonumber(ARGV[#ARGV])
if ARGV[i + 1] ~= '' or redis.call('EXISTS', KEYS[7]) == 1 then
  local now = now_ms()
  for field in string.gmatch(ARGV[i + 1], '[^\n]+') do
    if redis.call('HEXISTS', KEYS[5], field) == 1 then
      redis.call('ZADD', KEYS[7], now, field)
    end
  end
  local unused = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now - records_ttl, 'LIMIT', 0, 64)
  for _, field in ipairs(unused) do
    drop_anchor(KEYS[5], KEYS[6], KEYS[7], field)
  end
end
local dropped = 0
if logged > 0 then
  local max_bytes = tonumber(ARGV[#ARGV - 1])
  local held = redis.call('HINCRBY', KEYS[3], 'log_bytes', logged_bytes)
  local count = redis.call('XLEN', KEYS[1])
  while (held > max_bytes or count > max_events) and count > 1 do
    local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 64)
    local ids = {}
    for _, entry in ipairs(oldest) do
      if (held <= max_bytes and count <= max_events) or count <= 1 then break end
      local size = #entry[2][2]
      held, count = held - size, count - 1
      if count < max_events then dropped = dropped + size end  -- else for the count bound
      ids[#ids + 1] = entry[1]
    end
    if #ids == 0 then break end
    redis.call('XDEL', KEYS[1], unpack(ids))
  end
  if held < 0 then held = 0 end
  redis.call('HSET', KEYS[3], 'log_bytes', held)
end
if added > 0 then
  -- The seen set only deduplicates logging: past twice the log it is started afresh.
  if redis.call('SCARD', KEYS[2]) > 2 * max_events then
    redis.call('DEL', KEYS[2])
  end
end
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ttl) end
for k = 4, 7 do redis.call('PEXPIRE', KEYS[k], records_ttl) end
return {added, dropped}
