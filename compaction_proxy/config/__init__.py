"""Configuration (pure): settings from YAML and the environment, errors that name where a bad
value came from, and the routing and policy resolution per model."""
