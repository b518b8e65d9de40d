-- KEYS: leases
-- ARGV: owner, lease_ms
-- Extends the lease while it is still ours. Returns 1 (renewed) or 0 (lost or taken over).
local now = now_ms()
local lease = redis.call('HGET', KEYS[1], ARGV[1])
if not lease then return 0 end
local anchor, expires = string.match(lease, '^(.*):(%d+)$')
if not expires or tonumber(expires) <= now then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], anchor .. ':' .. string.format('%d', now + tonumber(ARGV[2])))
return 1
