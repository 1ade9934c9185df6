"""dcgm-exporter's job mapping: one file per GPU with its jobs' ids, replaced whole, removed when free."""
import os
from types import SimpleNamespace

from hai_cluster.agent.dcgm import open_mapping


def run(job_id, *gpus):
    return SimpleNamespace(job_id=job_id, gpus=gpus)


def test_files_follow_the_runs(tmp_path):
    d = tmp_path / "map"
    (tmp_path / "map").mkdir(mode=0o700)
    (d / "7").write_text("999\n")  # a previous agent's
    m = open_mapping(str(d))
    assert m is not None and sorted(os.listdir(d)) == [] and (os.stat(d).st_mode & 0o777) == 0o755
    m.update([run(12, 0, 1), run(13, 1)])  # 13 shares card 1 (a fractional GPU)
    assert {n: (d / n).read_text() for n in os.listdir(d)} == {"0": "12\n", "1": "12\n13\n"}
    assert (os.stat(d / "0").st_mode & 0o777) == 0o644
    before = os.stat(d / "0").st_ino
    m.update([run(13, 1), run(12, 0, 1)])  # nothing changed: nothing written
    assert os.stat(d / "0").st_ino == before
    m.update([run(13, 1)])
    assert {n: (d / n).read_text() for n in os.listdir(d)} == {"1": "13\n"}
    m.update([])
    assert os.listdir(d) == []
    m.close()


def test_an_unsafe_directory_is_refused_and_off_is_off(tmp_path, caplog):
    assert open_mapping("") is None
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    assert open_mapping(str(d)) is None and "cannot be used" in caplog.text
