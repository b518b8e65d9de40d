-- KEYS: log, state, packed, segments, packing
-- ARGV: ttl_ms, first, last, count, frame, index line, merged index line ('' for none),
--       release (1: the caller holds the `packing` claim)
-- Lands one pack (store/log_segments.py): the stream's entries first..last become one
-- segment, appended to `packed` and `segments`, or replacing the newest segment when the
-- caller merged into it. Lands only when first is the stream's oldest entry and first..last
-- holds count entries: a pack always takes a prefix of the stream, whatever raced it.
-- Returns {1, tail_bytes} when it landed, {0} when the run is no longer the stream's head,
-- {-1} when the newest segment is no longer the one merged.
local function done(reply)
  if ARGV[8] == '1' then redis.call('DEL', KEYS[5]) end
  return reply
end
local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if not oldest[1] or oldest[1][1] ~= ARGV[2] then return done({0}) end
local run = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[3])
if #run ~= tonumber(ARGV[4]) or run[#run][1] ~= ARGV[3] then return done({0}) end
local merged, replaced = ARGV[7], 0
if merged ~= '' then
  if redis.call('LINDEX', KEYS[4], -1) ~= merged then return done({-1}) end
  replaced = tonumber(string.match(merged, '^%S+ %S+ %d+ (%d+)')) or 0
end
local freed = 0
for _, entry in ipairs(run) do
  local fields = entry[2]
  for k = 2, #fields, 2 do freed = freed + #fields[k] end
end
local ms, seq = string.match(ARGV[3], '^(%d+)-(%d+)$')
redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. string.format('%.0f', tonumber(seq) + 1))
if merged ~= '' then
  redis.call('LSET', KEYS[3], -1, ARGV[5])
  redis.call('LSET', KEYS[4], -1, ARGV[6])
else
  redis.call('RPUSH', KEYS[3], ARGV[5])
  redis.call('RPUSH', KEYS[4], ARGV[6])
end
local function add(field, amount)
  local value = (tonumber(redis.call('HGET', KEYS[2], field) or '0') or 0) + amount
  value = math.max(value, 0)
  redis.call('HSET', KEYS[2], field, value)
  return value
end
local tail = add('tail_bytes', -freed)
add('log_bytes', #ARGV[5] - freed - replaced)
add('packed_events', #run)
for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], ARGV[1]) end
return done({1, tail})
