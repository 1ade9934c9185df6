import pytest
from hypothesis import given, strategies as st

from hai_cluster.core.hostlist import MAX_HOSTS, compress, expand, ranged, sort_key


@pytest.mark.parametrize("text, names", [
    ("", []),
    ("   ", []),
    ("gpu1", ["gpu1"]),
    ("node[01-04,07],gpu1", ["node01", "node02", "node03", "node04", "node07", "gpu1"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[5]", ["n5"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a, b ,c", ["a", "b", "c"]),
    ("n[1, 3]", ["n1", "n3"]),
    ("host.example_1", ["host.example_1"]),
    ("n1,n1", ["n1", "n1"]),  # expand keeps what it is given
])
def test_expand(text, names):
    assert expand(text) == names


@pytest.mark.parametrize("text, fragment", [
    ("n[1-3", "'[' is never closed"),
    ("n1-3]", "']' without '['"),
    ("n[[1-2]]", "nested '['"),
    ("n[]", "invalid range ''"),
    ("n[a-b]", "invalid range 'a-b'"),
    ("n[1-]", "invalid range '1-'"),
    ("n[-1]", "invalid range '-1'"),
    ("n[3-1]", "goes backwards"),
    ("n1,,n2", "empty host name"),
    ("n1,", "empty host name"),
    ("n 1", "invalid character"),
    ("n/1", "invalid character"),
    ("n[1-100000000]", f"more than {MAX_HOSTS} hosts"),
    ("a[1-300]b[1-300]", f"more than {MAX_HOSTS} hosts"),
    ("n[" + "1" * 5000 + "]", "longer than 18 digits"),  # int() itself refuses 4,300+ digits
    ("n[1-" + "9" * 19 + "]", "longer than 18 digits"),
])
def test_expand_rejects(text, fragment):
    with pytest.raises(ValueError, match="hostlist") as exc:
        expand(text)
    assert fragment in str(exc.value)


@pytest.mark.parametrize("names, text", [
    ([], ""),
    (["n1"], "n1"),
    (["n1", "n2", "n3", "x"], "n[1-3],x"),
    (["x", "n3", "n1", "n2"], "n[1-3],x"),
    (["n1", "n1", "n2"], "n[1-2]"),
    (["n1", "n3"], "n[1,3]"),
    (["n9", "n10", "n11"], "n[9-11]"),
    (["node01", "node02", "node03", "node04", "node07", "gpu1"], "gpu1,node[01-04,07]"),
    (["n08", "n09", "n10"], "n[08-10]"),
    (["n9", "n09"], "n[9,09]"),  # different names, so kept apart
    (["n1-ib", "n2-ib"], "n1-ib,n2-ib"),  # only a trailing number is collapsed
    (["login", "n2", "a7"], "a7,login,n2"),
    (["n", "n1"], "n,n1"),
    (["n10", "n2"], "n[2,10]"),  # numeric, not string, order
])
def test_compress(names, text):
    assert compress(names) == text


@pytest.mark.parametrize("name", ["a,b", "n[1]", "", "two words"])
def test_compress_rejects_names_that_would_not_expand_back(name):
    with pytest.raises(ValueError, match="cannot be written in a hostlist"):
        compress(["n1", name])


def test_a_name_with_thousands_of_trailing_digits_is_written_back_as_it_came():
    long = "n" + "7" * 5000
    assert compress([long]) == long
    assert ranged([long, long]) == f"{long[:-18]}[{'7' * 18},{'7' * 18}]"
    assert expand(ranged([long, long])) == [long, long]
    assert sort_key(long)[1] == int("7" * 18)


def test_sort_key_orders_numerically():
    assert sorted(["n10", "n2", "m5", "n1"], key=sort_key) == ["m5", "n1", "n2", "n10"]


_prefixes = st.sampled_from(["n", "node", "gpu-", "rack1-n", "a.b", ""])
_plain = st.sampled_from(["login", "n1-ib", "head", "n"])


@st.composite
def _host(draw, padded=True):
    if draw(st.integers(0, 9)) == 0:
        return draw(_plain)
    number = draw(st.integers(0, 300))
    width = draw(st.integers(1, 4)) if padded else 1
    return draw(_prefixes) + str(number).zfill(width)


@given(st.lists(_host(), max_size=60))
def test_round_trip(names):
    out = expand(compress(names))
    assert sorted(out) == sorted(set(names))
    assert len(out) == len(set(out))


@given(st.lists(_host(padded=False), max_size=60))
def test_round_trip_order_without_padding(names):
    assert expand(compress(names)) == sorted(set(names), key=sort_key)


@given(st.lists(_host(), max_size=60))
def test_compress_is_stable(names):
    once = compress(names)
    assert compress(expand(once)) == once


# What Slurm 22.05's `scontrol show hostlist` / `hostlistsorted` printed for these (run here).
@pytest.mark.parametrize("names,unsorted,sorted_", [
    ("n3,n1,n2,n2,x,n4", "n[3,1-2,2],x,n4", "n[1-2,2-4],x"),
    ("a1,a2", "a[1-2]", "a[1-2]"),
    ("n5,n6,n8", "n[5-6,8]", "n[5-6,8]"),
    ("a1-ib,a2-ib", "a1-ib,a2-ib", "a1-ib,a2-ib"),
    ("n1,n1", "n[1,1]", "n[1,1]"),
    ("n1,n1,n2", "n[1,1-2]", "n[1,1-2]"),
    ("n1,n2,n3,n5,n6", "n[1-3,5-6]", "n[1-3,5-6]"),
    ("n9,n10,n11,n01,n02", "n[9-11,01-02]", None),  # Slurm's sort of mixed padding is its own
])
def test_ranged_writes_what_slurms_hostlist_writes(names, unsorted, sorted_):
    assert ranged(names.split(",")) == unsorted
    if sorted_ is not None:
        assert ranged(names.split(","), sort=True) == sorted_
    assert expand(unsorted) == names.split(",")  # and it reads back as given


def test_ranged_refuses_a_name_that_would_not_read_back():
    with pytest.raises(ValueError, match="cannot be written"):
        ranged(["a,b"])
