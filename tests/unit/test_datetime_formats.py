import datetime as dt

import pytest

from hai_cluster.core.timefmt import parse_datetime

NOW = dt.datetime(2026, 11, 30, 14, 30, 0).timestamp()


def at(*args) -> float:
    return dt.datetime(*args).timestamp()


@pytest.mark.parametrize("text, expected", [
    ("now", NOW), ("now+1hour", NOW + 3600), ("now+90", NOW + 90), ("now+2days", NOW + 172800),
    ("now-3h", NOW - 10800), ("NOW+1w", NOW + 604800),
    ("2026-12-01", at(2026, 12, 1)), ("2026-12-01T08:15", at(2026, 12, 1, 8, 15)),
    ("2026-12-01T08:15:30", at(2026, 12, 1, 8, 15, 30)), ("12/24", at(2026, 12, 24)), ("1/2/27", at(2027, 1, 2)),
    ("16:00", at(2026, 11, 30, 16)), ("09:00", at(2026, 11, 30, 9)), ("midnight", at(2026, 11, 30)),
    ("tomorrow", at(2026, 12, 1)), ("today", at(2026, 11, 30)), ("teatime", at(2026, 11, 30, 16)),
])
def test_points_in_time(text, expected):
    assert parse_datetime(text, NOW) == expected


def test_begin_means_the_next_such_time():
    assert parse_datetime("09:00", NOW, future=True) == at(2026, 12, 1, 9)
    assert parse_datetime("16:00", NOW, future=True) == at(2026, 11, 30, 16)
    assert parse_datetime("noon", NOW, future=True) == at(2026, 12, 1, 12)


@pytest.mark.parametrize("text, message", [("yesterday-ish", "expected now"), ("2026-13-01", "month"),
                                            ("25:00", "hour"), ("now+5parsecs", "expected now"), ("", "expected"),
                                            ("now+" + "9" * 320, "too large")])  # a float cannot hold it
def test_bad_times(text, message):
    with pytest.raises(ValueError, match=message):
        parse_datetime(text, NOW)
