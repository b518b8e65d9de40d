-- KEYS: log, state, segments, packing, the new segment's key, the merged segment's key (the
--       new one's again when nothing is merged)
-- ARGV: ttl_ms, mode ('held': first is an ordinal; 'read': an entry id), first, count, last
--       (entry id), freed (the run's stored bytes), index line, merged index line ('' for
--       none), release (1: the caller holds the `packing` claim), epoch (of a held run's
--       ordinals)
-- Lands one pack (store/log_segments.py). The caller has written the segment's frame to its
-- key; this takes the stream's entries first..last off the stream and lists the segment, after
-- the newest or in place of the merged one, or deletes the frame when the run is not the
-- stream's head any more. A run the caller logged is checked by ordinals (it starts at the
-- stream's oldest entry, and the stream holds only entries the state counts); a run read back
-- by its first entry's id. Returns {1, tail_bytes} when the pack landed, {0} when the run is
-- not the stream's head, {-1} when the newest segment is not the one merged.
local function release()
  if ARGV[9] == '1' then redis.call('DEL', KEYS[4]) end
end
local function refused(code)
  redis.call('DEL', KEYS[5])
  release()
  return {code}
end
local s = log_state(KEYS[1], KEYS[2])
local count = tonumber(ARGV[4])
if ARGV[2] == 'held' then
  local first = tonumber(ARGV[3])
  if ARGV[10] ~= s.epoch or first ~= s.oldest
      or redis.call('XLEN', KEYS[1]) ~= s.logged - s.oldest + 1 then
    return refused(0)
  end
else
  local head = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  if not head[1] or head[1][1] ~= ARGV[3] then return refused(0) end
end
local merged = ARGV[8]
if merged ~= '' and redis.call('LINDEX', KEYS[3], -1) ~= merged then return refused(-1) end
local stored = tonumber(string.match(ARGV[7], '^%S+ %S+ %d+ (%d+)')) or 0
local replaced = merged ~= '' and tonumber(string.match(merged, '^%S+ %S+ %d+ (%d+)')) or 0
local ms, seq = string.match(ARGV[5], '^(%d+)-(%d+)$')
redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. string.format('%.0f', tonumber(seq) + 1))
if merged ~= '' then
  redis.call('LSET', KEYS[3], -1, ARGV[7])
  if KEYS[6] ~= KEYS[5] then redis.call('DEL', KEYS[6]) end
else
  redis.call('RPUSH', KEYS[3], ARGV[7])
end
local freed = tonumber(ARGV[6])
-- Whatever else the stream held (entries another version logged) is counted from here on.
s.oldest = s.logged - redis.call('XLEN', KEYS[1]) + 1
s.tail_bytes = s.tail_bytes - freed
s.log_bytes = s.log_bytes + stored - freed - replaced
s.packed_events = s.packed_events + count
s.dirty = true
logged_reply(KEYS[2], 1)
release()
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ARGV[1]) end
return {1, math.max(s.tail_bytes, 0)}
