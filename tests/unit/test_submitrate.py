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


def test_connections_of_one_uid_beyond_their_rate_are_refused_and_logged_once_a_while(caplog):
    """Fifth audit: a connect loop (~2,900/s) locked everyone out of the socket, and refusals
    were a log line each."""
    from hai_cluster.controller.connlimit import LOG_EVERY, ConnectionCounter
    now = [0.0]
    counter = ConnectionCounter(64, rate=10.0, burst=20, clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="hai.access"):
        verdicts = [counter.too_fast(1000) for _ in range(120)]
        assert verdicts.count(False) == 20 and not any(counter.too_fast(0) for _ in range(100))  # root never
        now[0] += 1.0
        assert [counter.too_fast(1000) for _ in range(12)].count(False) == 10  # refilled at the rate
        assert not counter.too_fast(1001)  # another uid has its own bucket
        now[0] += LOG_EVERY
        assert [counter.too_fast(1000) for _ in range(21)].count(True) == 1  # the burst again, then one refused
    lines = [r.getMessage() for r in caplog.records if "uid=1000" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("refused 1 connection(s)") and "refused 102 connection(s)" in lines[1]


def test_take_now_takes_a_token_or_nothing():
    now = [0.0]
    rate = SubmitRate(2.0, 3, lambda: now[0])
    assert [rate.take_now(1000) for _ in range(5)] == [True, True, True, False, False]
    now[0] = 0.5  # one token back
    assert [rate.take_now(1000) for _ in range(2)] == [True, False]
    assert rate.take(1000, 1) == 0.5  # the same bucket: a submission now waits for its token
    assert all(rate.take_now(0) for _ in range(10))  # root never waits
