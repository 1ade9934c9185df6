"""Runtime `none`: the job script itself, as the user, with no container (as before runtimes)."""
from __future__ import annotations

from . import Context, Launch, Runtime


class Plain(Runtime):
    name = "none"

    def prepare(self, ctx: Context) -> Launch:
        # The environment is exactly the controller's plus HAI_CONTROL_DIR: no container variables.
        return Launch(argv=[ctx.script, *ctx.spec.script_args], env=dict(ctx.env),
                      label=f"the job script {ctx.script}")


RUNTIME = Plain  # what runtimes.get() builds for this module (core/runtimes.py names it)
