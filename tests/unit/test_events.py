"""Event lines are one greppable key=value line."""
import pytest

from hai_cluster.controller.events import EventLog, format_line


def test_lines_quote_values_with_spaces_and_skip_empty_fields():
    line = format_line("preempted", 7, None, {"for_job": 9, "by": "scheduler", "reason": 'level 2 run "x"'})
    assert line == 'event=preempted job=7 for_job=9 by=scheduler reason="level 2 run \\"x\\""'
    assert format_line("node_down", None, "gpu01", {}) == "event=node_down node=gpu01"


def test_unknown_kinds_are_a_bug_not_a_row():
    with pytest.raises(ValueError, match="unknown event kind"):
        EventLog().record("exploded", 1)
