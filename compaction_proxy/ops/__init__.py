"""Running it: the app factory, the command line (serve, admin commands, client keys),
worker processes and the container's health check."""
