"""utils_fs: a file or folder appears whole under its final name, or not at all, and a failed write leaves what
was there."""

from __future__ import annotations

import os

import pytest

from utils.utils_fs import atomic_open, atomic_path


def test_a_file_appears_whole_and_a_failed_write_keeps_the_old_one(tmp_path):
    path = tmp_path / "sub" / "metrics.csv"
    with atomic_open(path, "w") as f:
        f.write("a,b\n")
        assert not path.exists() and os.listdir(path.parent) == [os.path.basename(f.name)]
        assert os.path.basename(f.name).startswith(".metrics.csv.tmp")  # hidden, beside the target
    assert path.read_text() == "a,b\n"
    with pytest.raises(RuntimeError, match="disk full"), atomic_open(path, "w") as f:
        f.write("half")
        raise RuntimeError("disk full")
    assert path.read_text() == "a,b\n" and os.listdir(path.parent) == ["metrics.csv"]


def test_a_folder_replaces_a_missing_one_only(tmp_path):
    root = tmp_path / "videos"
    with atomic_path(root) as tmp:
        os.makedirs(tmp)
        open(os.path.join(tmp, "a.mp4"), "w").close()
    assert os.listdir(root) == ["a.mp4"]
    with pytest.raises(OSError), atomic_path(root) as tmp:  # another process's complete folder is never replaced
        os.makedirs(tmp)
        open(os.path.join(tmp, "b.mp4"), "w").close()
    assert os.listdir(root) == ["a.mp4"] and os.listdir(tmp_path) == ["videos"]
