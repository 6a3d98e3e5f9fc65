"""Test dataset over video files (mp4/avi/mkv/mov/...), read with PyAV (:mod:`utils.utils_video_file`), one item
per video.

Items follow the test-dataset contract: ``{'L': (T, C, h, w), 'H': (T, 3, H, W) (when a GT video is given),
'folder': <video stem>, 'lq_path': [...], 'gt_path': [...]}``, float32 RGB in [0, 1], plus what a caller needs to
write the result as a video like the input: ``'fps'`` (exact, a :class:`~fractions.Fraction`), ``'has_audio'``
and ``'video_path'`` (the LQ file, the source of the audio). The frame "paths" are ``<stem>/<index:08d>``
names, used to name the output frames. :meth:`VideoFileTestDataset.lazy_item` gives the same item with frame
sources (:class:`VideoFrames`, decoding one frame at a time) in place of the ``'L'``/``'H'`` tensors.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import torch
from torch.utils.data import Dataset

from data.data_roots import writes_synthetic
from data.dataset_options import RGB_CHANNELS, resolve_options
from data.frame_sources import NOISE_OPTIONS, NoisyFrames, add_noise, sigma_map
from data.synthetic_videos import SYNTHESIZE_DEFAULTS, refuse_synthesize, synthesize_videos
from utils import utils_dist
from utils.utils_option_schema import OPT_STR, REQUIRED, Opt
from utils.utils_video_clips import VIDEO_EXTENSIONS, is_video_file, list_videos
from utils.utils_video_file import VideoFileError, VideoReader, VideoWriter

logger = logging.getLogger(__name__)

__all__ = ["VideoFileTestDataset", "VideoFrames", "read_video", "write_video"]




def read_video(path: str) -> tuple[torch.Tensor, Fraction]:
    """Decode a whole video.

    Returns:
        ``(T, 3, H, W)`` float32 RGB in [0, 1] and the exact frame rate.

    Raises:
        VideoFileError: unreadable, not a video, zero frames or a frame size that changes (naming the file).
    """
    with VideoReader(path) as reader:
        return _decode(reader), reader.fps


class VideoFrames:
    """The frames of a video file, decoded one at a time (a frame source: ``len()`` and ``frames(start)``).

    Args:
        path: the video file.
        num_frames: its frame count when already known (else read from the container on first use).
        sigma: when non-zero, append the constant noise-level map (non-blind denoising of already noisy frames).
    """

    def __init__(self, path: str, num_frames: int | None = None, sigma: float = 0.0) -> None:
        self.path = self.name = path
        self._num_frames = num_frames
        self.sigma = sigma

    def __len__(self) -> int:
        if self._num_frames is None:
            with VideoReader(self.path) as reader:
                self._num_frames = reader.num_frames
        return self._num_frames

    def frames(self, start: int = 0) -> Iterator[torch.Tensor]:
        """Frames ``start, start + 1, ...`` as ``(3, H, W)`` float32 RGB in [0, 1] (the values of
        :func:`read_video`; ``(4, H, W)`` with ``sigma``); the frames before ``start`` are decoded but not
        converted.

        Raises:
            VideoFileError: the file cannot be decoded (named).
        """
        with VideoReader(self.path) as reader:
            for frame in reader.frames(start):
                out = torch.empty(3, *frame.shape[:2])  # (3, H, W) contiguous, converted in one pass, as read_video
                out.copy_(torch.from_numpy(frame).permute(2, 0, 1))
                out.div_(255.0)
                yield sigma_map(out[None], self.sigma)[0] if self.sigma else out


def _decode(reader: VideoReader) -> torch.Tensor:
    frames = [torch.from_numpy(frame) for frame in reader]  # uint8: a quarter of the float clip
    out = torch.empty(len(frames), 3, *frames[0].shape[:2])
    for i, frame in enumerate(frames):
        out[i] = frame.permute(2, 0, 1)
    return out.div_(255.0)


def write_video(path: str, frames: torch.Tensor, fps: Fraction | float | int = 25, codec: str | None = None,
                crf: int | None = None, audio_from: str | None = None) -> None:
    """Encode ``frames`` ``(T, 3, H, W)`` RGB in [0, 1] (clamped, rounded) to ``path`` atomically.

    The codec follows the extension unless given (``.mkv`` -> lossless FFV1, ``.mp4``/``.mov`` -> H.264); see
    :class:`utils.utils_video_file.VideoWriter` for ``codec``, ``crf`` and ``audio_from``.
    """
    with VideoWriter(path, fps, codec=codec, crf=crf, audio_from=audio_from) as writer:
        for frame in frames:
            writer.write(frame)


class VideoFileTestDataset(Dataset):
    """One item per LQ video file, with the matching GT video (same file name) when ``dataroot_gt`` is given.

    Every video is opened when the dataset is built, so an unreadable file or one without a video stream is
    reported up front; the frames are decoded lazily, one clip per item.

    Args:
        opt: the keys of :attr:`OPTIONS` (plus the common dataset keys); not modified. With GT and ``sigma > 0``
            the input is GT plus Gaussian noise (seed ``noise_seed``) with the sigma map as a 4th channel, like
            ``VideoRecurrentTestDataset``; without GT the LQ frames are taken as noisy and the map appended, like
            ``SingleVideoRecurrentTestDataset``.

    Raises:
        utils.utils_option.OptionError: an unknown key or a wrong type.
        FileNotFoundError: no LQ video, or GT videos missing.
        VideoFileError: a file that is not a readable video (its path in the message).
    """

    OPTIONS: dict[str, Opt] = {
        "n_channels": RGB_CHANNELS,
        **NOISE_OPTIONS,
        "dataroot_lq": Opt(str, REQUIRED, f"A video file, or a folder of them ({', '.join(VIDEO_EXTENSIONS)})."),
        "dataroot_gt": Opt(OPT_STR, None, "The GT video, or a folder of GT videos named like the LQ ones (null: "
                           "no scores)."),
        "synthesize_if_missing": Opt((dict, type(None)), None, "Footage without GT (no `dataroot_gt`): when "
                                     "`dataroot_lq` does not exist and is the folder this names as `root`, write "
                                     "synthetic H.264 videos there first (rank 0, atomically), with the keys of the "
                                     "training set's `synthesize_if_missing` (the real-world demo's held-out "
                                     "footage). A `dataroot_lq` other than `root` is never written. null: never "
                                     "write.", refuse=refuse_synthesize),
    }

    def __init__(self, opt: dict[str, Any]) -> None:
        super().__init__()
        self.opt = opt = resolve_options(type(self), opt)
        if opt["synthesize_if_missing"] and opt["dataroot_gt"]:
            raise ValueError(f"{type(self).__name__}: synthesize_if_missing writes footage without GT; leave "
                             "dataroot_gt unset")
        if writes_synthetic(opt, "dataroot_lq"):
            spec = {k: v for k, v in opt["synthesize_if_missing"].items() if k != "root"}
            utils_dist.rank0_first(lambda: synthesize_videos(opt["dataroot_lq"], {**SYNTHESIZE_DEFAULTS, **spec},
                                                             "dataroot_lq"))
        self.lq_files = list_videos(opt["dataroot_lq"])
        if not self.lq_files:
            raise FileNotFoundError(f"dataroot_lq={opt['dataroot_lq']!r}: no video file "
                                    f"({', '.join(VIDEO_EXTENSIONS)})")
        gt_root = opt["dataroot_gt"]
        self.gt_files: list[str | None] = [None] * len(self.lq_files)
        if gt_root:
            if is_video_file(gt_root):
                if len(self.lq_files) != 1:
                    raise ValueError(f"dataroot_gt={gt_root!r} is one video but dataroot_lq holds "
                                     f"{len(self.lq_files)}; give a directory of GT videos with the same names")
                self.gt_files = [gt_root]
            else:
                self.gt_files = [os.path.join(gt_root, os.path.basename(p)) for p in self.lq_files]
                missing = [p for p in self.gt_files if not os.path.isfile(p)]
                if missing:
                    raise FileNotFoundError(f"GT videos missing for {len(missing)} LQ video(s), e.g. {missing[0]}")
        for path in self.lq_files + [p for p in self.gt_files if p is not None]:
            VideoReader(path).close()  # raises VideoFileError naming an unreadable file
        self.sigma = opt["sigma"] / 255.0
        self.noise_seed = opt["noise_seed"]

    def __len__(self) -> int:
        return len(self.lq_files)

    def __getitem__(self, index: int) -> dict[str, Any]:
        lq_file, gt_file = self.lq_files[index], self.gt_files[index]
        stem = os.path.splitext(os.path.basename(lq_file))[0]
        with VideoReader(lq_file) as reader:
            lq = _decode(reader)
            item: dict[str, Any] = {"folder": stem, "fps": reader.fps, "has_audio": reader.has_audio,
                                    "video_path": lq_file}
        if gt_file is not None:
            gt, _ = read_video(gt_file)
            if gt.shape[0] != lq.shape[0]:
                raise VideoFileError(f"{lq_file} has {lq.shape[0]} frames but its GT {gt_file} has {gt.shape[0]}")
            item["H"] = gt
            if self.sigma:
                lq = add_noise(gt, self.sigma, seed=self.noise_seed)
        elif self.sigma:  # already noisy frames: the noise-level map only
            lq = sigma_map(lq, self.sigma)
        item["L"] = lq
        names = [f"{i:08d}" for i in range(lq.shape[0])]
        item["lq_path"] = [os.path.join(stem, n) for n in names]
        item["gt_path"] = list(item["lq_path"])
        return item

    def lazy_item(self, index: int) -> dict[str, Any]:
        """The item with :class:`VideoFrames` as ``'L'`` and ``'H'`` (a :class:`~data.frame_sources.NoisyFrames`
        of the GT as ``'L'`` for a non-zero ``sigma``); nothing is decoded until their frames are read.

        Raises:
            VideoFileError: the LQ and GT frame counts differ (naming both files).
        """
        lq_file, gt_file = self.lq_files[index], self.gt_files[index]
        stem = os.path.splitext(os.path.basename(lq_file))[0]
        with VideoReader(lq_file) as reader:
            lq: Any = VideoFrames(lq_file, reader.num_frames, sigma=0.0 if gt_file else self.sigma)
            item: dict[str, Any] = {"folder": stem, "fps": reader.fps, "has_audio": reader.has_audio,
                                    "video_path": lq_file}
        if gt_file is not None:
            gt = VideoFrames(gt_file)
            if len(gt) != len(lq):
                raise VideoFileError(f"{lq_file} has {len(lq)} frames but its GT {gt_file} has {len(gt)}")
            item["H"] = gt
            if self.sigma:
                lq = NoisyFrames(gt, self.sigma, seed=self.noise_seed)
        item["L"] = lq
        item["lq_path"] = [os.path.join(stem, f"{i:08d}") for i in range(len(lq))]
        item["gt_path"] = list(item["lq_path"])
        return item
