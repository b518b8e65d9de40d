-- KEYS: state, records (before anchoring), anchored, positions, leases
-- ARGV: chain blob, width
-- One atomic snapshot of a branch: state, older records, anchored records, lease holder and
-- where its compaction ends.
local blob, width = ARGV[1], tonumber(ARGV[2])
local owner, position = lease_on(KEYS[5], blob, width, now_ms(), false)
return {
  redis.call('HGETALL', KEYS[1]),
  redis.call('LRANGE', KEYS[2], 0, -1),
  branch_values(KEYS[3], KEYS[4], blob, width),
  owner,
  position,
}
