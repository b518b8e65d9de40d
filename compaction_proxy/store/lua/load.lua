-- KEYS: state, records, lease. One atomic snapshot of a conversation.
return {
  redis.call('HGETALL', KEYS[1]),
  redis.call('LRANGE', KEYS[2], 0, -1),
  redis.call('GET', KEYS[3]) or false,
}
