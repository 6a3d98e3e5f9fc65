"""Checksum-verified, atomic downloads (the caller gives the address and the digest).

Networks never download; the training flow calls these explicitly (on rank 0, followed by a barrier), and
``scripts/download_spynet.py`` does it by hand.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

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
    """Download ``url`` to ``dest``, verify its SHA-256 and move it into place atomically.

    The data goes to a temporary file in the destination directory, which replaces ``dest`` with
    ``os.replace`` only after the digest matched, so a crash or a concurrent reader never sees a partial file.

    Args:
        url: http(s):// or file:// address.
        dest: target file path; parent directories are created.
        sha256: the full hex digest, or a prefix of it (e.g. the 8 characters torch.hub puts in file names
            such as ``spynet_sintel_final-3d2a1287.pth``).
        timeout: socket timeout in seconds.

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
    fd, tmp_name = tempfile.mkstemp(prefix=f'.{dest.name}.', suffix='.part', dir=dest.parent)
    try:
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, 'wb') as out, urllib.request.urlopen(url, timeout=timeout) as resp:
                for block in iter(lambda: resp.read(_CHUNK), b''):
                    digest.update(block)
                    out.write(block)
        except (urllib.error.URLError, OSError) as err:
            raise RuntimeError(
                f'Could not download {url} to {dest}: {err}. If this machine is offline, fetch the file elsewhere '
                f'and copy it to {dest}.'
            ) from err
        actual = digest.hexdigest()
        if not actual.startswith(expected):
            raise RuntimeError(
                f'Checksum mismatch for {url}: SHA-256 {actual} does not match the expected {expected}; '
                f'the file was not written to {dest}.'
            )
        os.replace(tmp_name, dest)
    finally:
        if os.path.exists(tmp_name):
            os.remove(tmp_name)
    logger.info('Downloaded %s to %s (sha256 %s)', url, dest, actual)
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
    go on or all stop (under torchrun, one rank failing alone would leave the others waiting).

    Returns:
        ``None`` when the file is there, else the reason it could not be fetched (the same text on every rank).
    """
    error = None
    if not os.path.isfile(path) and utils_dist.get_rank() == 0:
        try:
            ensure_file(path, url, sha256)
        except (RuntimeError, ValueError, OSError) as exc:
            error = str(exc)
    return utils_dist.broadcast_object(error)


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
