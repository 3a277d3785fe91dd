"""bench/lib/scratch.py: a benchmark's scratch folder is removed when it finishes and kept, named, when it fails."""

import tempfile

import pytest


def test_removed_on_success_kept_and_named_on_failure(tmp_path, monkeypatch, capsys, bench_script):
    scratch_dir = bench_script("bench.lib.scratch").scratch_dir
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch_dir("ok-") as root:
        (root / "run").mkdir()
    assert not root.exists()
    with pytest.raises(SystemExit), scratch_dir("bad-") as root:
        raise SystemExit("training died")
    assert root.is_dir() and f"kept for inspection in {root}" in capsys.readouterr().err
    with scratch_dir("keep-", keep=True) as kept:
        pass
    assert kept.is_dir()
