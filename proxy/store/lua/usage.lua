-- KEYS: log, seen, state, records
-- ARGV: ttl_ms, max_log_events, anchor_json ('' to keep the anchor), n_attributes,
--       (field, value)*, event*, records_ttl_ms
-- After a request was answered: its events, the new meter anchor, its attributes; the log is
-- kept to about max_log_events.
local n = tonumber(ARGV[4])
local i = 5
for _ = 1, n do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
for j = i, #ARGV - 1 do
  redis.call('XADD', KEYS[1], '*', 'e', ARGV[j])
end
redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', tonumber(ARGV[2]))
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[3], 'anchor', ARGV[3])
end
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ARGV[1]) end
redis.call('PEXPIRE', KEYS[4], ARGV[#ARGV])
return 1
