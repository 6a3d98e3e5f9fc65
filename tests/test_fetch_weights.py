"""SpyNet weights are fetched by rank 0 before the network is built; offline is a clear error, never a download
inside a constructor and never a silent random SpyNet."""

from __future__ import annotations

import pytest

from engine.train import ConfigError, fetch_weights
from utils import utils_download


def test_missing_spynet_offline_is_a_clear_error(tmp_path, monkeypatch):
    def offline(path, url, sha):
        raise RuntimeError(f"Could not download https://example/spynet.pth to {path}: offline")

    monkeypatch.setattr(utils_download, "ensure_file", offline)
    missing = str(tmp_path / "model_zoo" / "spynet.pth")
    with pytest.raises(ConfigError, match=r"netG.spynet_path = '.*spynet.pth' is missing and could not be fetched"):
        fetch_weights({"netG": {"spynet_path": missing}})


def test_fetch_only_when_missing(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(utils_download, "ensure_file", lambda path, url, sha: calls.append(path))
    present = tmp_path / "spynet.pth"
    present.write_bytes(b"x")
    fetch_weights({"netG": {"spynet_path": str(present)}})
    fetch_weights({"netG": {"spynet_path": None}})
    assert calls == []
    fetch_weights({"netG": {"spynet_path": str(tmp_path / "absent.pth")}})
    assert calls == [str(tmp_path / "absent.pth")]
