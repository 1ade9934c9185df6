import pytest
from hypothesis import given, strategies as st

from hai_cluster.core.timefmt import format_duration, format_limit, parse_size_mb, parse_time_limit, slurm_cpu_time


@pytest.mark.parametrize("text, seconds", [
    ("90", 90 * 60),  # minutes
    ("1", 60),
    ("10:30", 10 * 60 + 30),  # minutes:seconds
    ("0:45", 45),
    ("1:02:03", 3600 + 2 * 60 + 3),  # hours:minutes:seconds
    ("2-12", 2 * 86400 + 12 * 3600),  # days-hours
    ("1-02:30", 86400 + 2 * 3600 + 30 * 60),  # days-hours:minutes
    ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),  # days-hours:minutes:seconds
    ("0-0:0:1", 1),
    ("1:90", 150),  # like Slurm, fields are not range-checked
    ("  15  ", 15 * 60),
])
def test_parse_time_limit_forms(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["0", "00", "0:00", "0-0", "0:0:0", "UNLIMITED", "unlimited",
                                  "Infinite", "INFINITE", "-1"])
def test_no_limit(text):
    assert parse_time_limit(text) is None


@pytest.mark.parametrize("text, fragment", [
    ("", "invalid time limit"),
    ("abc", "invalid time limit 'abc'"),
    ("1:", "expected minutes"),
    (":5", "expected minutes"),
    ("1::2", "expected minutes"),
    ("1-", "expected minutes"),
    ("1-2:3:4:5", "expected minutes"),
    ("1:2:3:4", "expected minutes"),
    ("1.5", "expected minutes"),
    ("1h", "expected minutes"),
    ("-5", "must not be negative"),
    ("-1-00:00", "must not be negative"),
    ("٣", "expected minutes"),  # a non-ASCII digit
])
def test_parse_time_limit_rejects(text, fragment):
    with pytest.raises(ValueError, match="invalid time limit") as exc:
        parse_time_limit(text)
    assert fragment in str(exc.value)


@pytest.mark.parametrize("seconds, text", [
    (0, "0:00"), (5, "0:05"), (59, "0:59"), (60, "1:00"), (3599, "59:59"),
    (3600, "1:00:00"), (36000 + 61, "10:01:01"), (86399, "23:59:59"),
    (86400, "1-00:00:00"), (93784, "1-02:03:04"), (100 * 86400, "100-00:00:00"),
    (12.9, "0:12"),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_duration_rejects_negative():
    with pytest.raises(ValueError, match="negative duration"):
        format_duration(-1)


def test_format_limit():
    assert format_limit(None) == "UNLIMITED"
    assert format_limit(3600) == "1:00:00"


@given(st.integers(min_value=1, max_value=10**9))
def test_duration_round_trips_through_the_parser(seconds):
    assert parse_time_limit(format_duration(seconds)) == seconds


@given(st.integers(0, 400), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_days_form_matches_arithmetic(d, h, m, s):
    total = d * 86400 + h * 3600 + m * 60 + s
    assert parse_time_limit(f"{d}-{h}:{m:02d}:{s:02d}") == (total or None)


@pytest.mark.parametrize("text, mb", [
    ("100", 100), ("100M", 100), ("100m", 100), ("1K", 1), ("1024K", 1), ("1025k", 2),
    ("2G", 2048), ("2g", 2048), ("1T", 1024 * 1024), ("32GB", 32768), ("500gb", 512000),
    ("4mb", 4), (" 8G ", 8192),
])
def test_parse_size_mb(text, mb):
    assert parse_size_mb(text) == mb


@pytest.mark.parametrize("text, fragment", [
    ("0", "must be greater than zero"),
    ("0G", "must be greater than zero"),
    ("-1", "must not be negative"),
    ("-4G", "must not be negative"),
    ("", "expected a positive integer"),
    ("G", "expected a positive integer"),
    ("1.5G", "expected a positive integer"),
    ("12X", "expected a positive integer"),
    ("1GiB", "expected a positive integer"),
    ("10B", "expected a positive integer"),  # B only after a unit, as in Slurm
    ("lots", "expected a positive integer"),
])
def test_parse_size_mb_rejects(text, fragment):
    with pytest.raises(ValueError, match="invalid memory size") as exc:
        parse_size_mb(text)
    assert fragment in str(exc.value)


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["K", "M", "G", "T"]))
def test_size_is_rounded_up_to_whole_mib(n, unit):
    kib = n * {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}[unit]
    mb = parse_size_mb(f"{n}{unit}")
    assert (mb - 1) * 1024 < kib <= mb * 1024


def test_a_time_limit_past_what_the_store_holds_is_refused():
    """Every reader refuses it (the script's -t, hcontrol update, MaxTime): update had stored 10^17 s."""
    assert parse_time_limit("35791394:07") == 2**31 - 1  # minutes:seconds, the longest
    for text in ("99999999999999999999", "35791394:08", "24856-0"):
        with pytest.raises(ValueError, match="longer than 2147483647 seconds"):
            parse_time_limit(text)


@pytest.mark.parametrize("seconds,shown", [(0, "00:00:00"), (5, "00:00:05"), (1.234, "00:01.234"),
                                           (59.5, "00:59.500"), (3600.5, "01:00:00"), (90061, "1-01:01:01")])
def test_cpu_times_as_sacct_prints_totalcpu(seconds, shown):
    """sacct's _elapsed_time: milliseconds only under an hour, and only when there are some."""
    assert slurm_cpu_time(seconds) == shown
