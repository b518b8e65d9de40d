-- KEYS: leases
-- ARGV: chain blob, width
-- 1 when a live lease lies on the chain, else 0.
if lease_on(KEYS[1], ARGV[1], tonumber(ARGV[2]), now_ms(), false) then return 1 end
return 0
