"""Reaching a node's agent socket as a byte stream (local or SSH) and the RPC spoken over it."""
