-- KEYS: lease, log, seen, state, records
-- ARGV: owner, lease_ms, ttl_ms, start_event
-- Takes the lease and logs compaction/start in one step; 0 when another live lease holds it.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
redis.call('XADD', KEYS[2], '*', 'e', ARGV[4])
for k = 2, #KEYS do redis.call('PEXPIRE', KEYS[k], ARGV[3]) end
return 1
