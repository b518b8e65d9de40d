-- KEYS: log, segments
-- ARGV: after (an entry id; '' for the log's start), count, segment key prefix
-- One consistent read of a page of the log: the frames of the segments that end after
-- `after` until they hold `count` events after it, then up to `count` stream entries after it.
-- Returns {frames, entries}.
local after, want, prefix = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local function later(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return true end
  am, bm = tonumber(am), tonumber(bm)
  if am ~= bm then return am > bm end
  return tonumber(as) > tonumber(bs)
end
local frames, events = {}, 0
for _, line in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  if events >= want then break end
  local first, last, n = string.match(line, '^(%S+) (%S+) (%d+)')
  if last and (after == '' or later(last, after)) then
    frames[#frames + 1] = redis.call('GET', segment_key(prefix, line)) or ''
    -- A segment holding `after` counts none of its events: the page may need the next one.
    if after == '' or later(first, after) then events = events + tonumber(n) end
  end
end
local start = after == '' and '-' or '(' .. after
return {frames, redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', want)}
