"""hai-controller: the scheduling loop, the applier's caller, dispatch to agents, reconciliation,
and the client API."""
