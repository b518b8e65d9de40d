-- KEYS: leases, log, seen, state, records (before anchoring), anchored, positions, used,
--       segments
-- ARGV: owner, ttl_ms, n_events, event*, n_records, (anchor, record)*, n_superseded,
--       (anchor, record)*, new checkpoint ends (JSON), ends kept, records_ttl_ms
-- Lands only while the lease is still ours: events, records under their anchors (superseded
-- ones dropped), the conversation's last checkpoint ends, the next generation (one past the
-- counter, never below the clock: branches.py's generation_after), lease released.
local now = now_ms()
local lease = redis.call('HGET', KEYS[1], ARGV[1])
local expires = lease and tonumber(string.match(lease, ':(%d+)$'))
if not expires or expires <= now then
  return {-1}
end
local i = 3
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  log_event(KEYS[2], KEYS[4], ARGV[i])
  i = i + 1
end
local added = {}
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  added[#added + 1] = {ARGV[i], ARGV[i + 1]}
  i = i + 2
end
local counter = redis.call('HGET', KEYS[4], 'generation')
if counter and not string.match(counter, '^%d+$') then
  -- Unreadable (damaged, or another version's): set past every commit on record, so the
  -- orders this commit writes repeat none.
  local newest = 0
  for _, value in ipairs(redis.call('HVALS', KEYS[6])) do
    for order in string.gmatch(value, '(%d+)[^\n]*') do
      local g = math.floor(tonumber(order) / 65536)
      if g > newest then newest = g end
    end
  end
  redis.call('HSET', KEYS[4], 'generation', newest)
end
local clock = math.floor((now - 1767225600000) / 100)  -- tenths of a second since 2026
local generation = math.max(tonumber(redis.call('HGET', KEYS[4], 'generation') or '0') + 1, clock)
redis.call('HSET', KEYS[4], 'generation', string.format('%d', generation))
local mark = string.format('%d', generation * 65536)
n = tonumber(ARGV[i] or '0'); i = i + 1
for _ = 1, n do
  local field, stored = ARGV[i], ARGV[i + 1]
  i = i + 2
  redis.call('LREM', KEYS[5], 0, stored)
  local value = redis.call('HGET', KEYS[6], field)
  if value then
    local kept, dropped = {}, false
    for line in string.gmatch(value, '[^\n]+') do
      local space = string.find(line, ' ', 1, true)
      if not space then
        -- an earlier commit's mark: replaced by this one's below
      elseif not dropped and string.sub(line, space + 1) == stored then
        dropped = true
      else
        kept[#kept + 1] = line
      end
    end
    kept[#kept + 1] = mark
    redis.call('HSET', KEYS[6], field, table.concat(kept, '\n'))
  end
end
for index, record in ipairs(added) do
  local field = record[1]
  local line = string.format('%d', generation * 65536 + index - 1) .. ' ' .. record[2]
  local value = redis.call('HGET', KEYS[6], field)
  if value then
    redis.call('HSET', KEYS[6], field, value .. '\n' .. line)
  else
    redis.call('HSET', KEYS[6], field, line)
    redis.call('HINCRBY', KEYS[7], string.match(field, '^(%d+):'), 1)
  end
  redis.call('ZADD', KEYS[8], now, field)
end
local ends = cjson.decode(ARGV[#ARGV - 2])
if #ends > 0 then
  local kept = cjson.decode(redis.call('HGET', KEYS[4], 'ends') or '[]')
  if type(kept) ~= 'table' then kept = {} end
  for _, e in ipairs(ends) do kept[#kept + 1] = e end
  while #kept > tonumber(ARGV[#ARGV - 1]) do table.remove(kept, 1) end
  redis.call('HSET', KEYS[4], 'ends', cjson.encode(kept))
end
redis.call('HDEL', KEYS[1], ARGV[1])
for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
for k = 5, 8 do redis.call('PEXPIRE', KEYS[k], ARGV[#ARGV]) end
for k = 9, 9 do redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
return logged_reply(KEYS[4], generation)
