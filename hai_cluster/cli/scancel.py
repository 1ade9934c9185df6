"""scancel, as Slurm answers: hcancel's selection and signals, and Slurm 22.05's exit codes: a job
that is unknown or already ended is no error (said only with -v); a job not yours is."""
from __future__ import annotations

import click

from .common import check_cluster
from .hcancel import cancel

# what Slurm's scancel reports only when asked (-v), and does not count as a failure
_QUIET = ("Invalid job id specified", "already completing or completed")


@click.command(context_settings={"help_option_names": ["--help"]})
@click.argument("job_ids", nargs=-1)
@click.option("-u", "--user", "users", multiple=True, help="cancel these users' jobs")
@click.option("--me", is_flag=True, help="cancel my jobs")
@click.option("-t", "--state", "states", multiple=True, help="only jobs in these states (e.g. PENDING)")
@click.option("-n", "--name", "--jobname", "names", multiple=True, help="only jobs with these names")
@click.option("-p", "--partition", "partitions", multiple=True, help="only jobs in these partitions")
@click.option("-s", "--signal", "sig", help="send this signal instead of cancelling")
@click.option("-Q", "--quiet", is_flag=True, help="no error messages")
@click.option("-v", "--verbose", count=True, help="also report jobs that are unknown or ended")
@click.option("-M", "--clusters", help="only the local cluster")
def main(job_ids, users, me, states, names, partitions, sig, quiet, verbose, clusters):
    """Cancel jobs (or send them a signal), as Slurm's scancel."""
    check_cluster("scancel", clusters)
    cancel("scancel", job_ids, users, me, states, names, partitions, sig,
           lambda err: not quiet and (verbose > 0 or not any(q in err for q in _QUIET)))
