"""utils_download without network: file:// URLs to temporary files."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from pathlib import Path

import pytest

from models.network_spynet import SPYNET_SHA256_PREFIX
from scripts.download_spynet import main as download_main
from utils import utils_dist
from utils.utils_download import download_verified, ensure_file, ensure_file_on_rank0, sha256_of


@pytest.fixture
def source(tmp_path: Path) -> tuple[str, str]:
    src = tmp_path / 'src' / 'weights.bin'
    src.parent.mkdir()
    src.write_bytes(b'pretend weights' * 1000)
    return src.as_uri(), hashlib.sha256(src.read_bytes()).hexdigest()


def _leftovers(directory: Path) -> list[str]:
    """Temporaries of a download (torch.hub's ``<dest>.<hex>.partial``, or any other name beside the file)."""
    return [p.name for p in directory.iterdir() if p.name not in ('a.bin', 'b.bin', 'out.bin', 'src')]


def test_full_digest_and_prefix(tmp_path: Path, source: tuple[str, str]) -> None:
    url, digest = source
    dest = download_verified(url, tmp_path / 'out' / 'a.bin', digest)
    assert dest.read_bytes() == b'pretend weights' * 1000
    assert sha256_of(dest) == digest
    dest2 = download_verified(url, tmp_path / 'out' / 'b.bin', digest[:8].upper())
    assert dest2.is_file()
    assert _leftovers(tmp_path / 'out') == []


def test_bad_hash_leaves_nothing(tmp_path: Path, source: tuple[str, str]) -> None:
    url, _ = source
    dest = tmp_path / 'out' / 'a.bin'
    with pytest.raises(RuntimeError, match='Checksum mismatch'):
        download_verified(url, dest, '00000000')
    assert not dest.exists()
    assert _leftovers(dest.parent) == []


def test_bad_hash_keeps_existing_file(tmp_path: Path, source: tuple[str, str]) -> None:
    url, _ = source
    dest = tmp_path / 'a.bin'
    dest.write_bytes(b'old')
    with pytest.raises(RuntimeError):
        download_verified(url, dest, 'ffff')
    assert dest.read_bytes() == b'old'


def test_missing_source(tmp_path: Path) -> None:
    url = (tmp_path / 'nope.bin').as_uri()
    with pytest.raises(RuntimeError, match='Could not download'):
        download_verified(url, tmp_path / 'out.bin', 'abcd')
    assert not (tmp_path / 'out.bin').exists()
    assert _leftovers(tmp_path) == []


def test_empty_digest_rejected(tmp_path: Path, source: tuple[str, str]) -> None:
    with pytest.raises(ValueError):
        download_verified(source[0], tmp_path / 'x', '')


def test_ensure_file_keeps_existing_file_and_verifies_new_one(tmp_path: Path, source: tuple[str, str]) -> None:
    existing = tmp_path / 'spynet.pth'
    existing.write_bytes(b'mine')
    assert ensure_file(existing, 'file:///does/not/exist', SPYNET_SHA256_PREFIX) == existing
    # the pretend file's digest does not start with the official prefix -> refused
    with pytest.raises(RuntimeError, match='Checksum mismatch'):
        ensure_file(tmp_path / 'new.pth', source[0], SPYNET_SHA256_PREFIX)
    assert not (tmp_path / 'new.pth').exists()


def test_script_reports_failure(tmp_path: Path) -> None:
    assert download_main(['--out', str(tmp_path / 's.pth'), '--url', (tmp_path / 'nope').as_uri()]) == 1
    (tmp_path / 's.pth').write_bytes(b'x')
    assert download_main(['--out', str(tmp_path / 's.pth')]) == 0


def test_a_silent_server_is_an_error_after_the_timeout(tmp_path: Path) -> None:
    """torch.hub's urlopen has no timeout; ours bounds a stalled download (rank 0 would hold every rank)."""
    server = socket.socket()
    server.bind(('127.0.0.1', 0))
    server.listen(1)  # the kernel accepts the connection; nothing ever answers
    url = f'http://127.0.0.1:{server.getsockname()[1]}/weights.bin'
    outcome: list[str] = []

    def fetch() -> None:
        try:
            download_verified(url, tmp_path / 'a.bin', 'abcd', timeout=0.5)
        except RuntimeError as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    thread.join(10)
    server.close()
    assert outcome and outcome[0].startswith(f'Could not download {url}'), outcome
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize('rank', [0, 1])
def test_rank0_fetches_and_every_rank_gets_the_same_error_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               rank: int) -> None:
    """A rank other than 0 never downloads; it returns the text rank 0 broadcast (here: a missing source)."""
    url, dest = (tmp_path / 'nope.bin').as_uri(), str(tmp_path / 'out.bin')
    sent: list[object] = []
    rank0_error = f'Could not download {url} to {dest}: offline'
    monkeypatch.setattr(utils_dist, 'get_rank', lambda: rank)
    monkeypatch.setattr(utils_dist, 'broadcast_object',
                        lambda obj, src=0: sent.append(obj) or (obj if rank == 0 else ('RuntimeError', rank0_error)))
    error = ensure_file_on_rank0(dest, url, 'abcd')
    if rank == 0:
        assert error is not None and error.startswith(f'Could not download {url}') and sent == [('RuntimeError', error)]
    else:
        assert error == rank0_error and sent == [None]
    assert not os.path.exists(dest)
