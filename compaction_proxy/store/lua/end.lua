-- KEYS: leases, log, seen, state, records (before anchoring), anchored, positions, used
-- ARGV: owner, ttl_ms, end_event, records_ttl_ms
-- Logs compaction/end and releases the lease if it is still ours.
redis.call('XADD', KEYS[2], '*', 'e', ARGV[3])
redis.call('HDEL', KEYS[1], ARGV[1])
for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
for k = 5, 8 do redis.call('PEXPIRE', KEYS[k], ARGV[4]) end
return 1
