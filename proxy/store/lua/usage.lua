-- KEYS: log, seen, state, records
-- ARGV: ttl_ms, anchor_json ('' to keep the anchor), n_attributes, (field, value)*, event*
-- After a request was answered: its events, the new meter anchor, its attributes.
local n = tonumber(ARGV[3])
local i = 4
for _ = 1, n do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
for j = i, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'e', ARGV[j])
end
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[3], 'anchor', ARGV[2])
end
for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ARGV[1]) end
return 1
