-- KEYS: log, seen, state, records, lease
-- ARGV: ttl_ms, max_log_events, n_messages, (hash, content_key, by_content, event)*, n_events,
--       event*, n_attributes, (field, value)*
-- Logs each message whose chain hash is new (and, by_content, whose content is new too),
-- marking both keys seen; then the plain events, sets the
-- attributes, keeps the log to about max_log_events, and returns what a request needs in the
-- same round trip: {added, tip before this call, state hash, records, lease owner}.
local ttl = ARGV[1]
local max_events = tonumber(ARGV[2])
local previous_tip = redis.call('HGET', KEYS[3], 'tip') or false
local i = 3
local added = 0
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local hash, content_key, by_content = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local new = redis.call('SISMEMBER', KEYS[2], hash) == 0
  if new and by_content == '1' and content_key ~= '' then
    new = redis.call('SISMEMBER', KEYS[2], content_key) == 0
  end
  if new then
    redis.call('SADD', KEYS[2], hash)
    if content_key ~= '' then redis.call('SADD', KEYS[2], content_key) end
    redis.call('XADD', KEYS[1], '*', 'e', ARGV[i + 3])
    added = added + 1
  end
  i = i + 4
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
  i = i + 1
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
if added > 0 then
  redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', max_events)
  -- The seen set only deduplicates logging: past twice the log it is started afresh.
  if redis.call('SCARD', KEYS[2]) > 2 * max_events then
    redis.call('DEL', KEYS[2])
  end
end
for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], ttl) end
return {
  added,
  previous_tip,
  redis.call('HGETALL', KEYS[3]),
  redis.call('LRANGE', KEYS[4], 0, -1),
  redis.call('GET', KEYS[5]) or false,
}
