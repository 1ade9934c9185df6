"""The grace period between the checkpoint signal and SIGKILL: its default and its hard bound.
Its own module: the agent's RunSpec check and the step server import it, and both start faster
without core.model's dataclasses."""

DEFAULT_GRACE_SECONDS = 60
# The longest --grace any job may have: the agent refuses more (a job whose grace never ends
# outlives its time limit, preemption and an admin's cancel); a cluster's max_grace is lower.
MAX_GRACE_SECONDS = 3600
