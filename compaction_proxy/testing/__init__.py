"""Test and demo helpers: a fake OpenAI-compatible upstream."""
