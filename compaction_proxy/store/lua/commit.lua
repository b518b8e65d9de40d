-- KEYS: lease, log, seen, state, records
-- ARGV: owner, ttl_ms, n_events, event*, n_records, record*, n_superseded, record*,
--       records_ttl_ms
-- Lands only while the lease is still ours: events, records (superseded ones dropped),
-- generation + 1, lease released.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local i = 3
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('XADD', KEYS[2], '*', 'e', ARGV[i])
  i = i + 1
end
n = tonumber(ARGV[i]); i = i + 1
local added = {}
for _ = 1, n do
  added[#added + 1] = ARGV[i]
  i = i + 1
end
n = tonumber(ARGV[i] or '0'); i = i + 1
for _ = 1, n do
  redis.call('LREM', KEYS[5], 0, ARGV[i])
  i = i + 1
end
for _, record in ipairs(added) do
  redis.call('RPUSH', KEYS[5], record)
end
local generation = redis.call('HINCRBY', KEYS[4], 'generation', 1)
redis.call('DEL', KEYS[1])
for k = 2, 4 do redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
redis.call('PEXPIRE', KEYS[5], ARGV[#ARGV])
return generation
