"""Which files are videos, and ``main_test_vrt.py --save_video``'s writer of restored clips (on top of
:mod:`utils.utils_video_file`'s reader and writer)."""

from __future__ import annotations

import glob
import logging
import os
from fractions import Fraction

import torch

from utils.utils_video_file import CODECS, VideoFileError, VideoWriter

logger = logging.getLogger(__name__)

__all__ = ["CLIP_VIDEO_EXT", "VIDEO_EXTENSIONS", "clip_video_writer", "is_video_file", "list_videos",
           "write_clip_video"]

VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv")
SAVE_VIDEO_CRF = 18  # x264's "visually lossless" setting
# ``--save_video``'s container per codec: mp4 plays everywhere; PyAV refuses PNG in Matroska, so PNG goes to mov
CLIP_VIDEO_EXT = {"h264": ".mp4", "h265": ".mp4", "ffv1": ".mkv", "png": ".mov"}


def is_video_file(path: str) -> bool:
    """Whether ``path`` names an existing file with a video extension."""
    return os.path.isfile(path) and path.lower().endswith(VIDEO_EXTENSIONS)


def list_videos(root: str) -> list[str]:
    """``[root]`` for a video file, else the sorted video files directly inside the directory ``root``."""
    if is_video_file(root):
        return [root]
    return sorted(p for p in glob.glob(os.path.join(glob.escape(root), "*")) if is_video_file(p))


def write_clip_video(save_dir: str, clip: str, frames: torch.Tensor, fps: Fraction | float | int = 25,
                     audio_from: str | None = None, codec: str = "h264", crf: int | None = None) -> str:
    """``--save_video``: write a restored clip as a video people can play and share.

    By default ``<save_dir>/<clip>.mp4`` in H.264 (CRF 18, 4:2:0), which every player and browser opens; the exact
    frames are ``--save_result``'s PNGs. H.264/H.265 4:2:0 cannot store an odd frame size, so such a clip goes to a
    lossless ``<clip>.mkv`` (FFV1) instead. The frame rate and the audio of ``audio_from`` (the input video) are
    kept.

    Args:
        save_dir: output folder.
        clip: the clip name (the file stem).
        frames: ``(T, 3, H, W)`` RGB in [0, 1].
        fps: frame rate of the output.
        audio_from: a file whose audio track is copied over (``None``: no audio).
        codec, crf: see :func:`clip_video_writer`.

    Returns:
        The path written.
    """
    height, width = frames.shape[-2:]
    with clip_video_writer(save_dir, clip, height, width, fps, audio_from, codec=codec, crf=crf) as writer:
        for frame in frames:
            writer.write(frame)
    return writer.path


def clip_video_writer(save_dir: str, clip: str, height: int, width: int, fps: Fraction | float | int = 25,
                      audio_from: str | None = None, codec: str = "h264", crf: int | None = None) -> VideoWriter:
    """The writer :func:`write_clip_video` uses, to write a clip frame by frame.

    Args:
        save_dir, clip: the video is ``<save_dir>/<clip>`` plus the codec's extension (:data:`CLIP_VIDEO_EXT`).
        height, width: the frame size; an odd one cannot be stored by h264/h265 (4:2:0): lossless ``.mkv`` then,
            with a warning.
        fps, audio_from: frame rate; a file whose audio is carried over.
        codec: ``h264`` (default, plays everywhere), ``h265`` (smaller), ``ffv1`` or ``png`` (lossless).
        crf: quality of h264/h265 (lower is better; default 18 for h264, 20 for h265).
    """
    if codec not in CLIP_VIDEO_EXT:
        raise VideoFileError(f"--video_codec {codec!r} is unknown; use one of {', '.join(CLIP_VIDEO_EXT)}")
    lossy = CODECS[codec].default_crf is not None
    if lossy and (height % 2 or width % 2):
        path = os.path.join(save_dir, f"{clip}.mkv")
        logger.warning("%s: the frame size %dx%d is odd, which %s (4:2:0) cannot store; writing lossless FFV1",
                       path, width, height, codec)
        return VideoWriter(path, fps, audio_from=audio_from)
    if crf is None and codec == "h264":
        crf = SAVE_VIDEO_CRF
    return VideoWriter(os.path.join(save_dir, f"{clip}{CLIP_VIDEO_EXT[codec]}"), fps, codec=codec,
                       crf=crf if lossy else None, audio_from=audio_from)
