-- KEYS: log, seen, state, records, lease
-- ARGV: ttl_ms, max_log_events, n_messages, (hash, event)*, n_events, event*, n_attributes,
--       (field, value)*
-- Logs each message whose chain hash is new (SADD decides), then the plain events, sets the
-- attributes, keeps the log to about max_log_events, and returns what a request needs in the
-- same round trip: {added, tip before this call, state hash, records, lease owner}.
local ttl = ARGV[1]
local max_events = tonumber(ARGV[2])
local previous_tip = redis.call('HGET', KEYS[3], 'tip') or false
local i = 3
local added = 0
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[1], '*', 'e', ARGV[i + 1])
    added = added + 1
  end
  i = i + 2
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
