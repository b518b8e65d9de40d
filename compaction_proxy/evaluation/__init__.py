"""``compaction-proxy eval``: does compaction hurt an agent? Probes about what a policy took
out of view, asked with the whole history and with what was forwarded (pure core here; the
replay and the model calls in ``ops.evaluate``)."""
