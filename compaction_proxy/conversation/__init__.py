"""The conversation model (pure): canonical messages and chain hashes, replacement records,
the surface a request forwards, and what the session log holds and how it reads back."""
