"""Daemon logs under journald: syslog priority prefixes, no time of our own; elsewhere as before."""
import logging
import os

from hai_cluster import logsetup


def records(tmp_path, monkeypatch, journal: bool) -> list[str]:
    path = tmp_path / "log"
    with open(path, "w") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}" if journal else "1:2")
        root = logging.getLogger()
        saved, root.handlers = root.handlers, []
        try:
            logsetup.configure(logging.INFO, "%(asctime)s %(levelname)s %(name)s: %(message)s", stream)
            log = logging.getLogger("hai.test")
            log.info("event=submitted job=1 user=ann")
            log.warning("node n1: link lost\nforged line")
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("tick failed")
        finally:
            root.handlers = saved
    return path.read_text().splitlines()


def test_under_journald_each_line_has_its_priority_and_no_time(tmp_path, monkeypatch):
    lines = records(tmp_path, monkeypatch, journal=True)
    assert lines[0] == "<6>INFO hai.test: event=submitted job=1 user=ann"
    assert lines[1] == "<4>WARNING hai.test: node n1: link lost\\nforged line"  # still one record a line
    assert lines[2] == "<3>ERROR hai.test: tick failed" and all(line.startswith("<3>") for line in lines[2:])
    assert "<3>ValueError: boom" in lines


def test_elsewhere_the_lines_keep_their_time_and_no_prefix(tmp_path, monkeypatch):
    lines = records(tmp_path, monkeypatch, journal=False)
    assert lines[0].endswith(" INFO hai.test: event=submitted job=1 user=ann") and lines[0][:4].isdigit()
