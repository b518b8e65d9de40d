-- KEYS: lease, log, seen, state, records
-- ARGV: owner, ttl_ms, end_event
-- Logs compaction/end and releases the lease if it is still ours.
redis.call('XADD', KEYS[2], '*', 'e', ARGV[3])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
for k = 2, #KEYS do redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
return 1
