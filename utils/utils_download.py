"""Checksum-verified, atomic downloads (the caller gives the address and the digest), through
``torch.hub.download_url_to_file`` (its temporary file, SHA-256 prefix check and rename), with a socket timeout and
one-line errors added.

Networks never download; the training flow calls these explicitly (on rank 0, followed by a barrier), and
``scripts/download_spynet.py`` does it by hand.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import socket
import urllib.error
from pathlib import Path

import torch.hub

from utils import utils_dist

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20


def sha256_of(path: str | os.PathLike) -> str:
    """Hex SHA-256 digest of a file."""
    digest = hashlib.sha256()
    with open(path, 'rb') as fh:
        for block in iter(lambda: fh.read(_CHUNK), b''):
            digest.update(block)
    return digest.hexdigest()


def download_verified(url: str, dest: str | os.PathLike, sha256: str, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` with ``torch.hub.download_url_to_file``, which writes a temporary file beside
    ``dest``, checks its SHA-256 prefix and moves it into place only when it matches, so a crash or a concurrent
    reader never sees a partial file and a bad download never replaces an existing one.

    Args:
        url: http(s):// or file:// address.
        dest: target file path; parent directories are created.
        sha256: the full hex digest, or a prefix of it (e.g. the 8 characters torch.hub puts in file names
            such as ``spynet_sintel_final-3d2a1287.pth``); any case.
        timeout: seconds a connection may stay silent before the download fails (torch.hub sets none: a stalled
            server would hold rank 0, and every rank waiting for it, until the collective timeout).

    Returns:
        The destination path.

    Raises:
        ValueError: empty ``sha256``.
        RuntimeError: the download failed (offline, HTTP error, missing file) or the digest does not match.
    """
    expected = sha256.strip().lower()
    if not expected:
        raise ValueError('download_verified needs a SHA-256 digest or prefix, got an empty string')
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)  # torch.hub's urlopen takes no timeout; its sockets take this default
    try:
        torch.hub.download_url_to_file(url, os.fspath(dest), hash_prefix=expected, progress=False)
    except RuntimeError as err:
        if 'invalid hash value' not in str(err):
            raise
        raise RuntimeError(f'Checksum mismatch for {url}: {err}; the file was not written to {dest}.') from err
    except (urllib.error.URLError, OSError) as err:
        raise RuntimeError(
            f'Could not download {url} to {dest}: {err}. If this machine is offline, fetch the file elsewhere '
            f'and copy it to {dest}.'
        ) from err
    finally:
        socket.setdefaulttimeout(previous)
    logger.info('Downloaded %s to %s (sha256 %s)', url, dest, sha256_of(dest))
    return dest


def ensure_file(path: str | os.PathLike, url: str, sha256: str) -> Path:
    """Return ``path``, downloading ``url`` (checksum-verified, atomic) only when the file is missing.

    An existing file is trusted as is (it may be a user's own weights).
    """
    path = Path(path)
    if path.is_file():
        return path
    logger.info('%s is missing; downloading %s', path, url)
    return download_verified(url, path, sha256)


def ensure_file_on_rank0(path: str, url: str, sha256: str) -> str | None:
    """Rank 0 fetches a missing ``path`` (:func:`ensure_file`); every rank then gets the same answer, so all of them
    go on or all stop (:func:`utils.utils_dist.rank0_first`).

    Returns:
        ``None`` when the file is there, else the reason it could not be fetched (the same text on every rank).
    """
    try:
        utils_dist.rank0_first(lambda: None if os.path.isfile(path) else ensure_file(path, url, sha256),
                               catch=(RuntimeError, ValueError, OSError),
                               raise_as=lambda _name, text: RuntimeError(text))
    except (RuntimeError, ValueError, OSError) as exc:
        return str(exc)
    return None


def download_main(argv: list[str] | None, doc: str, *, label: str, url: str, sha256: str, default_out: str,
                  out_help: str = "destination file (kept as is if it already exists)") -> int:
    """The command line of a weight-download script (``--out``, ``--url``): fetch, verify, report in one line.

    Returns:
        The exit code: 0 when the file is ready, 1 (with the reason logged) when it could not be fetched.
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=default_out, help=out_help)
    parser.add_argument("--url", default=url, help="source address (http(s):// or file://)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = ensure_file(args.out, args.url, sha256)
    except RuntimeError as err:
        logger.error("%s", err)
        return 1
    logger.info("%s weights ready at %s", label, path)
    return 0
