-- KEYS: lease
-- ARGV: owner, lease_ms
-- Extends the lease while it is still ours. Returns 1 (renewed) or 0 (lost or taken over).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
