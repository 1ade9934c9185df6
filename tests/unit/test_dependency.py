"""--dependency: parsing, and what each kind says for the states of the jobs it names."""
import pytest

import random

from hai_cluster.core.dependency import (NEVER, WAITING, DependencyError, Settled, Target, evaluate,
                                         parse_dependency, settle, summarize)
from hai_cluster.core.states import JobState as S


def t(state, started=None):
    return Target(state, state != S.PENDING if started is None else started)


def of(found):
    """The repository's summary of each id's jobs."""
    return {key: summarize(ts) for key, ts in found.items()}


@pytest.mark.parametrize("text, canonical", [
    ("afterok:12", "afterok:12"),
    ("afterok:12:13_2,afterany:14", "afterok:12,afterok:13_2,afterany:14"),
    ("afterok:12:12:13,afterok:12", "afterok:12,afterok:13"),  # a term said again adds nothing
    ("afterok:12?afternotok:13", "afterok:12?afternotok:13"),
    ("singleton", "singleton"),
    ("after:5,singleton", "after:5,singleton"),
    ("after:5+10:6_2+0", "after:5+10,after:6_2"),
])
def test_parse(text, canonical):
    assert parse_dependency(text).text == canonical


@pytest.mark.parametrize("text, message", [
    ("afterok", "needs at least one job id"),
    ("afterok:x", "invalid job id 'x'"),
    ("afterok:1+10", r"a \+MINUTES delay is after's alone"),
    ("after:1+x", r"a delay is \+MINUTES"),
    ("after:1+999999", "at most 525600 minutes"),
    ("before:1", "invalid dependency type 'before'"),
    ("afterok:1,afterany:2?after:3", "cannot be mixed"),
    ("", "empty"),
    ("afterok:9223372036854775808", "too large"),  # past what the store holds
])
def test_bad_dependencies_name_the_problem(text, message):
    with pytest.raises(DependencyError, match=message):
        parse_dependency(text)


@pytest.mark.parametrize("kind, states, verdict", [
    ("afterok", [S.COMPLETED], None),
    ("afterok", [S.RUNNING], WAITING),
    ("afterok", [S.FAILED], NEVER),
    ("afterok", [S.COMPLETED, S.PENDING], WAITING),  # an array: every task must be done
    ("afterok", [S.COMPLETED, S.CANCELLED, S.PENDING], NEVER),
    ("afternotok", [S.FAILED], None),
    ("afternotok", [S.TIMEOUT, S.COMPLETED], None),
    ("afternotok", [S.COMPLETED], NEVER),
    ("afternotok", [S.RUNNING], WAITING),
    ("afterany", [S.FAILED, S.COMPLETED], None),
    ("afterany", [S.FAILED, S.RUNNING], WAITING),
    ("after", [S.RUNNING], None),
    ("after", [S.CANCELLED], None),
    ("after", [S.PENDING], WAITING),
])
def test_each_kind(kind, states, verdict):
    dep = parse_dependency(f"{kind}:7")
    assert evaluate(dep, of({(7, None): [t(s) for s in states]})) == verdict


def test_requeued_job_that_ran_counts_as_started_for_after():
    assert evaluate(parse_dependency("after:7"), of({(7, None): [t(S.PENDING, started=True)]})) is None


def test_and_or_and_tasks():
    targets = of({(1, None): [t(S.COMPLETED)], (2, None): [t(S.FAILED)], (3, 1): [t(S.RUNNING)]})
    assert evaluate(parse_dependency("afterok:1,afterok:2"), targets) == NEVER
    assert evaluate(parse_dependency("afterok:1?afterok:2"), targets) is None
    assert evaluate(parse_dependency("afterok:2?afterok:3_1"), targets) == WAITING
    assert evaluate(parse_dependency("afterok:2?afternotok:1"), targets) == NEVER
    assert evaluate(parse_dependency("afterok:1,afterany:3_1"), targets) == WAITING
    assert evaluate(parse_dependency("afterok:99"), targets) == NEVER  # a job that is gone


def test_singleton():
    dep = parse_dependency("singleton")
    assert evaluate(dep, {}, singleton_clear=True) is None
    assert evaluate(dep, {}, singleton_clear=False) == WAITING


def test_settle_takes_out_the_terms_decided_for_good():
    targets = of({(1, None): [t(S.COMPLETED)], (2, None): [t(S.FAILED)], (3, None): [t(S.RUNNING)],
                  (4, None): [t(S.PENDING)]})
    rest = settle(parse_dependency("afterok:1,afterok:3,after:3,afterany:4,afterok:99,singleton"), targets, 0.0)
    # 1 is done and 3 has started: what stays can still change (99 is not found: yet, or gone)
    assert rest == Settled(parse_dependency("afterok:3,afterany:4,afterok:99,singleton"))
    assert settle(parse_dependency("afterok:1,afterok:2,afterok:3"), targets, 0.0) == Settled(None, NEVER)
    assert settle(parse_dependency("afterok:1,afterany:2,after:3"), targets, 0.0) == Settled(None, None)
    assert settle(parse_dependency("afterok:3?afternotok:2"), targets, 0.0) == Settled(None, None)
    assert settle(parse_dependency("afterok:2?afternotok:1"), targets, 0.0) == Settled(None, NEVER)
    assert settle(parse_dependency("afterok:2?afterok:3"), targets, 0.0).rest.terms == parse_dependency("afterok:3").terms
    waiting = parse_dependency("afterok:3,afterany:4")
    assert settle(waiting, targets, 0.0).rest is waiting  # nothing decided: the same terms


def test_a_settled_dependency_says_what_the_whole_one_says_as_its_jobs_move_on():
    """Pass after pass, settling what the last pass left gives the verdict that evaluating the
    whole dependency gives, for random dependencies over jobs that move through their states."""
    rng = random.Random(20261202)
    paths = [[S.PENDING, S.RUNNING, end] for end in (S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT)]
    for _ in range(400):
        jobs = {i: rng.choice(paths) for i in range(1, 6)}
        kinds = ["after", "afterok", "afternotok", "afterany"]
        terms = [f"{rng.choice(kinds)}:{rng.randint(1, 6)}" for _ in range(rng.randint(1, 5))]
        dep = parse_dependency(("?" if rng.random() < 0.4 else ",").join(terms))
        at = {i: 0 for i in jobs}
        left = Settled(dep)
        for _ in range(8):
            for i in rng.sample(sorted(at), 2):
                at[i] = min(at[i] + 1, 2)
            targets = of({(i, None): [t(jobs[i][at[i]])] for i in jobs})  # job 6 is never found
            if left.rest is not None:
                left = settle(left.rest, targets, 0.0)
            got = left.verdict if left.rest is None else evaluate(left.rest, targets)
            assert got == evaluate(dep, targets), (dep.text, at)


def test_after_with_a_delay_waits_that_many_minutes_from_the_start():
    dep = parse_dependency("after:7+10")
    started = of({(7, None): [Target(S.RUNNING, True, since=1000.0)]})
    assert evaluate(dep, started, now=1000.0 + 599) == WAITING
    assert evaluate(dep, started, now=1000.0 + 600) is None
    assert evaluate(dep, of({(7, None): [Target(S.PENDING, False)]}), now=10**9) == WAITING
    # a job cancelled before it ever started counts from its end, as Slurm's "start or cancellation"
    assert evaluate(dep, of({(7, None): [Target(S.CANCELLED, False, since=50.0)]}), now=50.0 + 600) is None
    # an array: from the last of its tasks to start
    tasks = of({(7, None): [Target(S.RUNNING, True, since=0.0), Target(S.RUNNING, True, since=500.0)]})
    assert evaluate(dep, tasks, now=900.0) == WAITING and evaluate(dep, tasks, now=1100.0) is None
    # settled only once the time has passed; a satisfied term stays satisfied
    assert settle(dep, started, 1200.0).rest == dep and settle(dep, started, 1600.0) == Settled(None, None)
