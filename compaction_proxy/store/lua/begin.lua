-- KEYS: leases, log, seen, state, records (before anchoring), anchored, positions, used,
--       segments
-- ARGV: owner, lease_ms, ttl_ms, start_event, expected_generation (-1: any), records_ttl_ms,
--       chain blob, width, lease anchor ("<position>:<hash>")
-- Takes a lease anchored on the chain and logs compaction/start in one step.
-- Returns, as lua/log.lua's reply: 1 (begun), 0 (busy: a live lease lies on the chain) or -1
-- (stale: the branch's generation moved on).
local chain = blob_chain(ARGV[7], tonumber(ARGV[8]))
local now = now_ms()
if lease_on(KEYS[1], chain, now, true) then
  return {0}
end
local expected = tonumber(ARGV[5])
if expected >= 0 then
  if branch_generation(KEYS[4], KEYS[5], KEYS[6], KEYS[7], chain) ~= expected then
    return {-1}
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[9] .. ':' .. string.format('%d', now + tonumber(ARGV[2])))
log_event(KEYS[2], KEYS[4], ARGV[4])
for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], ARGV[3]) end
for k = 5, 8 do redis.call('PEXPIRE', KEYS[k], ARGV[6]) end
for k = 9, 9 do redis.call('PEXPIRE', KEYS[k], ARGV[3]) end
return logged_reply(KEYS[4], 1)
