"""The wire between the daemons and their clients: framing, msgpack codec with its limits, message
envelopes, the controller-agent run contract."""
