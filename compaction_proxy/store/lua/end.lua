-- KEYS: lease, log, seen, state, records
-- ARGV: owner, ttl_ms, end_event, records_ttl_ms
-- Logs compaction/end and releases the lease if it is still ours.
redis.call('XADD', KEYS[2], '*', 'e', ARGV[3])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
for k = 2, 4 do redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
redis.call('PEXPIRE', KEYS[5], ARGV[4])
return 1
