"""Who may do what: tenants, client keys, whose credentials go where, and the guard that
keeps the proxy from forwarding to itself."""
