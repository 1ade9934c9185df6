"""Statements of the writes every job makes (submit, start, running, end), built once with bound
parameters. Building a SQLAlchemy statement and its cache key costs ~50 us each time, 4-6 times
what executing a prepared one costs: per job, that was a third of the controller's CPU (py-spy,
docs/BENCHMARKS.md). Parameter names start with `p_`: SQLAlchemy reserves the column names for
the VALUES and SET clauses."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

from sqlalchemy import Table, bindparam, select, text, update

from .schema import array_specs, gpus, jobs, nodes, run_ranks, runs

JOB_INSERT, RUN_INSERT, RANK_INSERT = jobs.insert(), runs.insert(), run_ranks.insert()
JOB_BY_ID = select(jobs).where(jobs.c.id == bindparam("p_id"))
ARRAY_SPEC_INSERT = array_specs.insert()
ARRAY_SPEC_OF = select(array_specs.c.spec).where(array_specs.c.array_job_id == bindparam("p_id"))
RUN_OF_ATTEMPT = select(runs).where(runs.c.job_id == bindparam("p_job"), runs.c.attempt == bindparam("p_attempt"))
RUN_ID_OF_ATTEMPT = select(runs.c.id).where(runs.c.job_id == bindparam("p_job"),
                                            runs.c.attempt == bindparam("p_attempt"))
RANKS_OF_RUN = select(run_ranks).where(run_ranks.c.run_id == bindparam("p_run")).order_by(run_ranks.c.rank)
# A live rank, spelled as the partial index ix_run_ranks_live says it (a bound parameter in its
# place would keep the planner off that index and on the whole history).
LIVE = text("run_ranks.state != 'ended'")
# The applier's fresh views of the nodes a start touches (store/views.py)
NODES_NAMED = select(nodes).where(nodes.c.name.in_(bindparam("p_names", expanding=True)))
GPUS_ON = (select(gpus).where(gpus.c.node.in_(bindparam("p_names", expanding=True)))
           .order_by(gpus.c.node, gpus.c.index))
LIVE_RANKS = (select(run_ranks, runs.c.job_id, runs.c.gpu_charge).join(runs, runs.c.id == run_ranks.c.run_id)
              .where(LIVE).order_by(run_ranks.c.rank))
LIVE_RANKS_ON = LIVE_RANKS.where(run_ranks.c.node.in_(bindparam("p_names", expanding=True)))
RANK_RUNNING = update(run_ranks).where(run_ranks.c.run_id == bindparam("p_run"), run_ranks.c.node == bindparam("p_node"),
                                       run_ranks.c.state == "starting").values(state="running")
RANK_ENDED = update(run_ranks).where(
    run_ranks.c.run_id == bindparam("p_run"), run_ranks.c.node == bindparam("p_node"),
    run_ranks.c.state != "ended").values(
    state="ended", exit_code=bindparam("p_exit_code"), exit_signal=bindparam("p_signal"),
    reason=bindparam("p_reason"), killed=bindparam("p_killed"), message=bindparam("p_message"),
    end_time=bindparam("p_end_time"), cpu_seconds=bindparam("p_cpu_seconds"), mem_peak_kb=bindparam("p_mem_peak_kb"))


@lru_cache(maxsize=64)
def _update(table: Table, keys: tuple[str, ...], versioned: bool):
    where = [table.c.id == bindparam("p_id")]
    if versioned:
        where.append(table.c.version == bindparam("p_version"))
    return update(table).where(*where).values({k: bindparam(f"p_{k}") for k in keys})


def update_by_id(table: Table, row_id: int, values: Mapping[str, Any], version: int | None = None):
    """(statement, parameters) setting `values` on the row `row_id` (and only at `version`, when
    given): one statement per set of columns, built the first time."""
    params = {f"p_{k}": v for k, v in values.items()}
    params["p_id"] = row_id
    if version is not None:
        params["p_version"] = version
    return _update(table, tuple(values), version is not None), params
