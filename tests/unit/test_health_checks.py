from hai_cluster.agent.health import gpu_count_problem, spool_problem


def test_gpu_count_change_is_a_problem():
    assert gpu_count_problem(8, 8) is None
    assert gpu_count_problem(8, 7) == "GPU count changed: 8 at agent start, 7 now"


def test_spool_nearly_full_is_a_problem():
    mib = 1024 * 1024
    assert spool_problem("/s", 90 * mib, 100 * mib, 95.0) is None
    why = spool_problem("/s", 96 * mib, 100 * mib, 95.0)
    assert why == "spool filesystem of /s is 96% full (limit 95%, 4 MiB free)"
    assert spool_problem("/s", 0, 0, 95.0) is None
