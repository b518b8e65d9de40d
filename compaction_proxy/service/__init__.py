"""The life of a request, given one ``Services``: prepare (read the conversation, relieve
pressure, derive the surface), recover from an overflow on evidence, record after the answer."""
