-- KEYS: one sorted set per quota (its calls, scored by time in ms)
-- ARGV: window_ms, member (unique per call), then one limit per key
-- A sliding window: takes one unit of every quota if none holds `limit` calls in the last
-- window_ms; returns 0 when taken, else the 1-based index of the first quota at its limit
-- (nothing is taken then). Time is Redis's own, so replicas agree.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local window = tonumber(ARGV[1])
for k = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now - window)
  if redis.call('ZCARD', KEYS[k]) >= tonumber(ARGV[k + 2]) then
    return k
  end
end
for k = 1, #KEYS do
  redis.call('ZADD', KEYS[k], now, ARGV[2])
  redis.call('PEXPIRE', KEYS[k], window)
end
return 0
