"""The per-uid submission rate (controller/submitrate.py), on a clock the test moves."""
import pytest

from hai_cluster.controller.submitrate import MAX_WAIT, OverRate, SubmitRate


def test_a_burst_then_the_rate_then_a_clear_refusal():
    now = [0.0]
    rate = SubmitRate(10.0, 100, lambda: now[0])
    assert [rate.take(1000, 1) for _ in range(100)] == [0.0] * 100  # the burst
    assert rate.take(1000, 1) == pytest.approx(0.1)  # then 10 a second, in turn
    assert rate.take(1000, 10) == pytest.approx(1.1)
    assert rate.take(2000, 100) == 0.0  # another user has a bucket of their own
    slow = SubmitRate(1.0, 100, lambda: now[0])
    assert slow.take(1000, 400) == 0.0  # an array bigger than the bucket takes all of it
    with pytest.raises(OverRate, match=r"at most 1 jobs a second and 100 at once.*these 100 can go in 100 s"):
        slow.take(1000, 100)  # would wait 100 s: past MAX_WAIT
    now[0] += MAX_WAIT
    assert slow.take(1000, 30) == 0.0  # refilled meanwhile (the refused one took nothing)
    assert rate.take(0, 10**6) == 0.0  # root is never limited
    assert SubmitRate(0, 1, lambda: 0.0).take(1000, 10**6) == 0.0  # 0: no limit
