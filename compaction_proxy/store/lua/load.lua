-- KEYS: state, records (before anchoring), anchored, positions, leases
-- ARGV: the chain's length ('' for the whole conversation), its hashes at the positions the
--       caller picked ("<position>:<hash>" space apart).
-- One atomic snapshot of a branch: {1, consulted, the values of LOAD_FIELDS, older records,
-- anchored records, lease holder, where its compaction ends}. `consulted`: the chain
-- positions its records and live leases lie at, space apart (the caller picks them next
-- time). {0, consulted} instead when the chain lacked one of them (another replica anchored or
-- leased there): the caller asks again with them.
-- The state fields a load reads, in store/redis_forms.py's LOAD_FIELDS order: the branch's
-- own, then the conversation's attributes (not the log's bookkeeping).
local LOAD_FIELDS = {
  'generation', 'anchor', 'tip', 'ends', 'tenant', 'session', 'model', 'context', 'last_seen',
  'last_pressure', 'checkpoint_misses', 'over_threshold', 'largest_answer_tokens',
  'compaction_failed_at', 'compaction_failed_tokens', 'overflow_recovery_at',
  'client_compactions',
}
local chain = picked_chain(ARGV[1], ARGV[2])
local owner, position = lease_on(KEYS[5], chain, nil, false)
local values = branch_values(KEYS[3], KEYS[4], chain)
local consulted = chain and table.concat(chain.consulted, ' ') or ''
if chain and #chain.missing > 0 then return {0, consulted} end
return {
  1,
  consulted,
  redis.call('HMGET', KEYS[1], unpack(LOAD_FIELDS)),
  redis.call('LRANGE', KEYS[2], 0, -1),
  values,
  owner,
  position,
}
