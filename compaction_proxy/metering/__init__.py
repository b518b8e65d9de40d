"""Token metering: the meter and its anchor, tokenizers loaded offline, context windows
(configured, mapped, learned) and the upstream's context-overflow errors."""
