"""Wire formats: each API's request parsed into the one format-neutral ``ClientRequest``
(chat messages, Responses items), and the surface written back into the client's own body."""
