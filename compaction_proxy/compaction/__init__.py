"""Compaction: pruning, range selection, summarization and the transaction that commits them."""
