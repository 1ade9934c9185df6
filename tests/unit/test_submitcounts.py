"""The submission counts kept between reads of the store (controller/submitcounts.py)."""
from hai_cluster.controller.submitcounts import REFRESH, SubmissionCounts


def test_counts_are_read_again_after_refresh_and_kept_up_with_submissions():
    reads = []
    now = [0.0]

    def read(key):
        reads.append(key)
        return {"user_pending": 5, "user_jobs": 7, "user_pending_bytes": 100, "account_pending": 0, "account_jobs": 0}
    counts = SubmissionCounts(read, clock=lambda: now[0])
    key = ("ann", None)
    assert counts.get(key)["user_pending"] == 5 and len(reads) == 1
    counts.added(key, 3, 50)
    n = counts.get(key)
    assert (n["user_pending"], n["user_jobs"], n["user_pending_bytes"]) == (8, 10, 150) and len(reads) == 1
    assert counts.get(key, fresh=True)["user_pending"] == 5 and len(reads) == 2  # near a limit: the store's
    now[0] += REFRESH
    counts.get(key)
    assert len(reads) == 3
    counts.get(("bob", "lab"))
    assert reads[-1] == ("bob", "lab")
