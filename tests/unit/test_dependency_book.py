"""The store's book of dependencies from pass to pass: it says what evaluating every dependency
afresh says, while looking up only ids still named and evaluating only jobs whose ids moved."""
import random

from hai_cluster.core.dependency import NEVER, WAITING, Target, evaluate, parse_dependency, summarize
from hai_cluster.core.states import JobState as S
from hai_cluster.store import dependencies
from hai_cluster.store.dependencies import DependencyBook


class World:
    """Jobs 1..n, each at a point of its path; what the repository's lookup would find."""

    def __init__(self, paths):
        self.paths, self.at, self.asked = paths, {i: 0 for i in paths}, []

    def targets(self):
        return {(i, None): summarize([Target(p[self.at[i]], self.at[i] > 0)]) for i, p in self.paths.items()}

    def lookup(self, keys):
        self.asked.append(set(keys))
        found = self.targets()
        return {k: found[k] for k in keys if k in found}


def never_singleton(job_ids):
    return {i: True for i in job_ids}


def counting(monkeypatch):
    calls = []
    real = dependencies.settle
    monkeypatch.setattr(dependencies, "settle", lambda dep, found, now: calls.append(dep.text) or real(dep, found, now))
    return calls


def test_a_pass_where_nothing_moved_evaluates_nothing_and_asks_only_for_open_ids(monkeypatch):
    done, running = [S.COMPLETED], [S.PENDING, S.RUNNING, S.COMPLETED]
    world = World({1: done, 2: done, 3: running, 4: [S.FAILED]})
    world.at[3] = 1
    book, settled = DependencyBook(), counting(monkeypatch)
    pending = {10: "afterok:1,afterok:2,afterok:3", 11: "afterok:1", 12: "afterok:4,afterok:3"}
    assert book.verdicts(pending, world.lookup, never_singleton, 0.0) == {10: WAITING, 11: None, 12: NEVER}
    assert len(settled) == 3
    del settled[:]
    assert book.verdicts(pending, world.lookup, never_singleton, 0.0) == {10: WAITING, 11: None, 12: NEVER}
    assert settled == [] and world.asked[-1] == {(3, None)}  # only 3 can still change 10's verdict
    world.at[3] = 2
    assert book.verdicts(pending, world.lookup, never_singleton, 0.0) == {10: None, 11: None, 12: NEVER}
    assert settled == ["afterok:3"] and world.asked[-1] == {(3, None)}
    assert book.verdicts(pending, world.lookup, never_singleton, 0.0)[10] is None and world.asked[-1] == set()
    # A changed dependency (hcontrol update) is read again; a job left out is forgotten.
    assert book.verdicts({10: "afternotok:3"}, world.lookup, never_singleton, 0.0) == {10: NEVER}
    assert list(book._entries) == [10] and book._named_by == {}


def test_a_singleton_is_asked_about_every_pass():
    world = World({1: [S.PENDING, S.RUNNING, S.COMPLETED]})
    world.at[1] = 1
    asked, book = [], DependencyBook()
    pending = {5: "singleton,afterok:1", 6: "singleton?after:1"}
    for clear in (False, True):
        got = book.verdicts(pending, world.lookup, lambda ids: asked.append(sorted(ids)) or {i: clear for i in ids}, 0.0)
        assert got == {5: WAITING, 6: None}  # 5 waits for 1 either way; 6 is clear by `after`
    assert asked == [[5, 6], [5]]  # 6 was decided for good in the first pass, and not asked again
    world.at[1] = 2
    assert book.verdicts(pending, world.lookup, lambda ids: {i: False for i in ids}, 0.0) == {5: WAITING, 6: None}
    assert book.verdicts(pending, world.lookup, lambda ids: {i: True for i in ids}, 0.0) == {5: None, 6: None}


def test_the_book_says_what_evaluating_afresh_says_as_jobs_come_move_and_go():
    rng = random.Random(1202)
    ends = (S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT)
    kinds = ("after", "afterok", "afternotok", "afterany")
    for _ in range(60):
        world = World({i: [S.PENDING, S.RUNNING, rng.choice(ends)] for i in range(1, 9)})
        book, pending = DependencyBook(), {}
        for _ in range(12):
            for i in rng.sample(sorted(world.at), 3):
                world.at[i] = min(world.at[i] + 1, 2)
            for job_id in rng.sample(range(100, 130), 6):  # some come or change, some go
                if rng.random() < 0.3:
                    pending.pop(job_id, None)
                else:
                    terms = [f"{rng.choice(kinds)}:{rng.randint(1, 9)}" for _ in range(rng.randint(1, 4))]
                    pending[job_id] = ("?" if rng.random() < 0.4 else ",").join(terms)
            found = world.targets()
            assert book.verdicts(dict(pending), world.lookup, never_singleton, 0.0) == {
                j: evaluate(parse_dependency(text), found) for j, text in pending.items()}
