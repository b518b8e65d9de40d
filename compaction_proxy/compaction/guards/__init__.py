"""Money guards: what stops a summary call that would be wasted or unbounded (a breaker per
summarizer, ceilings per tenant and route, the miss guard), each counted and logged once when it
trips (``trips``)."""
