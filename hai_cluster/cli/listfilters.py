"""The listing request of hqueue's and squeue's -u/--me, -j and -t (no click here: squeue's fast
start, squeue.py)."""
from __future__ import annotations

from ..core.jobids import ArrayError, parse_job_refs, refs_to_wire
from .common import fail, split_list


def filters(prog: str, users, me: bool, job_ids, states) -> tuple[dict, bool]:
    """The listing request for -u/--me, -j and -t (squeue's meanings), and whether -t named states."""
    me_user = None
    if me:
        import getpass
        me_user = getpass.getuser()
    try:
        return filter_body(users, me_user, job_ids, states)
    except ArrayError as exc:
        fail(prog, str(exc))


def filter_body(users, me_user: str | None, job_ids, states) -> tuple[dict, bool]:
    """filters() with --me's user name given (`me_user`, None without --me), raising ArrayError
    for a bad -j (the controller renders squeue's text with it: controller/api_listing_text.py)."""
    body: dict = {}
    if me_user is not None:
        body["users"] = [me_user]
    elif users:
        body["users"] = split_list(users)
    if job_ids:
        body.update(refs_to_wire(parse_job_refs(job_ids)))
    wanted = split_list(states)
    if wanted and [s.lower() for s in wanted] == ["all"]:
        body["all"] = True
    elif wanted:
        body["states"] = wanted
    return body, bool(wanted)
