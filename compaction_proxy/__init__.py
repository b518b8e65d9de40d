"""compaction-proxy: an OpenAI-compatible reverse proxy that compacts long conversations."""

__version__ = "0.1.0"
