-- KEYS: leases, log, seen, state, records (before anchoring), anchored, positions, used,
--       segments
-- ARGV: owner, ttl_ms, end_event, records_ttl_ms
-- Logs compaction/end and releases the lease if it is still ours.
log_event(KEYS[2], KEYS[4], ARGV[3])
redis.call('HDEL', KEYS[1], ARGV[1])
for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
for k = 5, 8 do redis.call('PEXPIRE', KEYS[k], ARGV[4]) end
for k = 9, 9 do redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
return logged_reply(KEYS[4], 1)
