-- KEYS: lease, log, seen, state, records
-- ARGV: owner, lease_ms, ttl_ms, start_event, expected_generation (-1: any), records_ttl_ms
-- Takes the lease and logs compaction/start in one step.
-- Returns 1 (begun), 0 (busy: another live lease) or -1 (stale: the generation moved on).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local expected = tonumber(ARGV[5])
if expected >= 0 then
  local generation = tonumber(redis.call('HGET', KEYS[4], 'generation') or '0')
  if generation ~= expected then
    return -1
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('XADD', KEYS[2], '*', 'e', ARGV[4])
for k = 2, 4 do redis.call('PEXPIRE', KEYS[k], ARGV[3]) end
redis.call('PEXPIRE', KEYS[5], ARGV[6])
return 1
