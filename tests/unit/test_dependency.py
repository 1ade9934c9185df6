"""--dependency: parsing, and what each kind says for the states of the jobs it names."""
import pytest

from hai_cluster.core.dependency import NEVER, WAITING, DependencyError, Target, evaluate, parse_dependency
from hai_cluster.core.states import JobState as S


def t(state, started=None):
    return Target(state, state != S.PENDING if started is None else started)


@pytest.mark.parametrize("text, canonical", [
    ("afterok:12", "afterok:12"),
    ("afterok:12:13_2,afterany:14", "afterok:12,afterok:13_2,afterany:14"),
    ("afterok:12?afternotok:13", "afterok:12?afternotok:13"),
    ("singleton", "singleton"),
    ("after:5,singleton", "after:5,singleton"),
])
def test_parse(text, canonical):
    assert parse_dependency(text).text == canonical


@pytest.mark.parametrize("text, message", [
    ("afterok", "needs at least one job id"),
    ("afterok:x", "invalid job id 'x'"),
    ("afterok:1+10", r"\+TIME"),
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
    assert evaluate(dep, {(7, None): [t(s) for s in states]}) == verdict


def test_requeued_job_that_ran_counts_as_started_for_after():
    assert evaluate(parse_dependency("after:7"), {(7, None): [t(S.PENDING, started=True)]}) is None


def test_and_or_and_tasks():
    targets = {(1, None): [t(S.COMPLETED)], (2, None): [t(S.FAILED)], (3, 1): [t(S.RUNNING)]}
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
