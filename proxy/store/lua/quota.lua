-- KEYS: one counter per quota, for the current window
-- ARGV: ttl_ms, then one limit per key
-- Takes one unit of every quota if none is at its limit; returns 0 when taken, else the
-- 1-based index of the first quota at its limit (nothing is taken then).
for k = 1, #KEYS do
  if tonumber(redis.call('GET', KEYS[k]) or '0') >= tonumber(ARGV[k + 1]) then
    return k
  end
end
for k = 1, #KEYS do
  redis.call('INCR', KEYS[k])
  redis.call('PEXPIRE', KEYS[k], ARGV[1])
end
return 0
