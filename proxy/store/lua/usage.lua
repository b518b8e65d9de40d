-- KEYS: log, seen, state, records
-- ARGV: ttl_ms, anchor_json ('' to keep the anchor), event*
for i = 3, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
end
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[3], 'anchor', ARGV[2])
end
for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ARGV[1]) end
return 1
