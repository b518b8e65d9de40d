-- KEYS: leases
-- ARGV: chain blob, width
-- 1 when a live lease lies on the chain, else 0.
local chain = blob_chain(ARGV[1], tonumber(ARGV[2]))
if lease_on(KEYS[1], chain, nil, false) then return 1 end
return 0
