"""hai-agent: the node daemon that runs each job's ranks under a root shepherd, as the job's user,
and reports their ends and the node's telemetry."""
