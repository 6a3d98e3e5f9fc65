"""The released VRT, RVRT, BasicVSR++ and IART models: constructor settings, test-time settings and where their weights
live.

``TASKS`` maps the task names of the official test scripts (``main_test_vrt.py`` of VRT, ``main_test_rvrt.py`` of
KAIR) to a :class:`TaskSpec`. Nothing here downloads: a missing weight file is one clear error naming the release
URL to fetch it from (or, where no direct file URL is verified, the folder the authors publish it in).

What is checked of a file saved under its release name: its full SHA-256 where the digest is known
(``TaskSpec.sha256``), else the leading hex digits the official file name carries (``TaskSpec.sha256_prefix``: the
first 8 hex digits, mmcv's ``publish_model`` rule, as torchvision and torch.hub check theirs), else nothing (the
VRT and RVRT releases publish no digest).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

from utils.utils_download import sha256_of

__all__ = ["TASKS", "ModelZooError", "TaskSpec"]

VRT_RELEASE = "https://github.com/JingyunLiang/VRT/releases/download/v0.0"
RVRT_RELEASE = "https://github.com/JingyunLiang/RVRT/releases/download/v0.0"
BASICVSRPP_RELEASE = "https://download.openmmlab.com/mmediting/restorers/basicvsr_plusplus"
# IART's README publishes its four models in this Google Drive folder ("Download models from this link and put them
# under experiments/"); its test scripts load them as experiments/pretrained_models/<name>.pth. No direct file URL is
# published, and the folder's listing could not be checked from here (no network): the names are the test scripts'.
IART_AUTHOR_FOLDER = "https://drive.google.com/drive/folders/1MIUK37Izc4IcA_a3eSH-21EXOZO5G5qU?usp=sharing"
RELEASES = {"vrt": VRT_RELEASE, "rvrt": RVRT_RELEASE, "basicvsrpp": BASICVSRPP_RELEASE, "iart": IART_AUTHOR_FOLDER}


class ModelZooError(FileNotFoundError):
    """A released model or test set is not on disk (the message says where to get it)."""


@dataclass(frozen=True)
class TaskSpec:
    """One released model and how the official script tests it.

    Attributes:
        name: the task name (also the weight file's stem).
        net_type: ``'vrt'``, ``'rvrt'``, ``'basicvsrpp'`` or ``'iart'`` (the family's release site is
            ``RELEASES[net_type]``).
        kwargs: constructor keyword arguments (use :meth:`net_kwargs` for a copy); what the network eats (scale,
            noise-level map, frame interpolation, padding multiple) is its own ``io`` (:mod:`models.net_io`).
        tile: README-recommended ``(frames, height, width)`` tile (0 = no tiling along that axis).
        tile_overlap: ``(frames, pixels, pixels)`` overlap of the tiles.
        vimeo_mirror: Vimeo-90K SR test of RVRT: 7 frames mirrored to 14, output ``(out[3] + out[10]) / 2``.
        default_sigma: noise level (0-255 scale) used when ``--sigma`` is not given.
        test_sets: the test sets the official script downloads for this task.
        sha256: the full SHA-256 (64 hex digits) of the released file, where known; checked in full.
        sha256_prefix: the leading hex digits of the SHA-256 that the official file name carries; checked when no
            full digest is known (both empty: not checked). Only a file saved under the release's own name is
            checked (any other path may be a user's own weights).
        published_in: where the weights are published when no direct file URL is verified (a shared folder); the
            missing-file error then names it and the file name to save, and :attr:`url` is empty.
    """

    name: str
    net_type: str
    kwargs: dict[str, Any]
    tile: tuple[int, int, int]
    tile_overlap: tuple[int, int, int] = (2, 20, 20)
    vimeo_mirror: bool = False
    default_sigma: int = 0
    test_sets: tuple[str, ...] = field(default_factory=tuple)
    sha256: str = ""
    sha256_prefix: str = ""
    published_in: str = ""

    def __post_init__(self) -> None:
        for value, length in ((self.sha256, 64), (self.sha256_prefix, 0)):
            if value and (value != value.lower() or any(ch not in "0123456789abcdef" for ch in value)
                          or (length and len(value) != length)):
                raise ValueError(f"TaskSpec {self.name}: {value!r} is not a lower-case hex SHA-256"
                                 f"{' (64 digits)' if length else ' prefix'}")
        if self.sha256 and self.sha256_prefix and not self.sha256.startswith(self.sha256_prefix):
            raise ValueError(f"TaskSpec {self.name}: sha256 {self.sha256} does not start with its name's prefix "
                             f"{self.sha256_prefix}")

    def net_kwargs(self) -> dict[str, Any]:
        """A fresh copy of the constructor kwargs."""
        return copy.deepcopy(self.kwargs)

    @property
    def url(self) -> str:
        """Release URL of the weight file (empty when only the folder :attr:`published_in` is known)."""
        return "" if self.published_in else f"{RELEASES[self.net_type]}/{self.name}.pth"

    @property
    def default_model_path(self) -> str:
        """``model_zoo/{vrt,rvrt,basicvsrpp,iart}/{task}.pth`` (the official scripts' location)."""
        return os.path.join("model_zoo", self.net_type, f"{self.name}.pth")

    def check_model_file(self, path: str) -> None:
        """Raise :class:`ModelZooError` saying where to get the file when ``path`` does not exist, or when the file
        under the release's own name fails the SHA-256 check (a partial or another download): the full digest
        where known, else the prefix the release's name carries."""
        if not os.path.isfile(path):
            if self.published_in:
                raise ModelZooError(f"model file {path} not found. Download {self.name}.pth from {self.published_in} "
                                    f"(where its authors publish it; no direct link is verified) and save it as "
                                    f"{path}; nothing is downloaded at run time")
            raise ModelZooError(f"model file {path} not found. Download it first (no download at run time):\n"
                                f"  mkdir -p {os.path.dirname(path) or '.'} && wget -O {path} {self.url}")
        if os.path.basename(path) != f"{self.name}.pth" or not (self.sha256 or self.sha256_prefix):
            return
        digest = sha256_of(path)
        if self.sha256 and digest != self.sha256:
            raise ModelZooError(f"model file {path} has SHA-256 {digest}, but the release {self.name}.pth has "
                                f"{self.sha256}: a partial or different download; fetch it again")
        if not self.sha256 and not digest.startswith(self.sha256_prefix):
            raise ModelZooError(f"model file {path} has SHA-256 {digest}, but the release {self.name}.pth has one "
                                f"starting with {self.sha256_prefix} (the prefix its name carries; the full digest "
                                f"is not published): a partial or different download; fetch it again")


# Constructor settings of the official test scripts.
_SR_DEPTHS = [8] * 7 + [4] * 6
_SR_DIMS = [120] * 7 + [180] * 6
_DEBLUR_DEPTHS = [8] * 7 + [4] * 4
_DEBLUR_DIMS = [96] * 7 + [120] * 4


def _vrt_sr(img_frames: int, window: list[int], pa_frames: int, groups: int) -> dict[str, Any]:
    return {"upscale": 4, "img_size": [img_frames, 64, 64], "window_size": window, "depths": _SR_DEPTHS,
            "indep_reconsts": [11, 12], "embed_dims": _SR_DIMS, "num_heads": [6] * 13, "pa_frames": pa_frames,
            "deformable_groups": groups}


def _vrt_restore(**extra: Any) -> dict[str, Any]:
    kwargs = {"upscale": 1, "img_size": [6, 192, 192], "window_size": [6, 8, 8], "depths": _DEBLUR_DEPTHS,
              "indep_reconsts": [9, 10], "embed_dims": _DEBLUR_DIMS, "num_heads": [6] * 11, "pa_frames": 2,
              "deformable_groups": 16}
    kwargs.update(extra)
    return kwargs


def _rvrt(upscale: int, dims: int, groups: list[int], **extra: Any) -> dict[str, Any]:
    kwargs = {"upscale": upscale, "clip_size": 2, "img_size": [2, 64, 64], "window_size": [2, 8, 8],
              "num_blocks": [1, 2, 1], "depths": [2, 2, 2], "embed_dims": [dims] * 3, "num_heads": [6, 6, 6],
              "inputconv_groups": groups, "deformable_groups": 12, "attention_heads": 12,
              "attention_window": [3, 3], "cpu_cache_length": 100}
    kwargs.update(extra)
    return kwargs


def _specs() -> list[TaskSpec]:
    vfi_kwargs = _vrt_restore(out_chans=3, img_size=[4, 192, 192], window_size=[4, 8, 8], indep_reconsts=[],
                              pa_frames=0)
    del vfi_kwargs["deformable_groups"]
    rvrt_sr = _rvrt(4, 144, [1, 1, 1, 1, 1, 1])
    return [
        TaskSpec("001_VRT_videosr_bi_REDS_6frames", "vrt", _vrt_sr(6, [6, 8, 8], 2, 12),
                 (40, 128, 128), test_sets=("REDS4",)),
        TaskSpec("002_VRT_videosr_bi_REDS_16frames", "vrt", _vrt_sr(16, [8, 8, 8], 6, 24),
                 (40, 128, 128), test_sets=("REDS4",)),
        TaskSpec("003_VRT_videosr_bi_Vimeo_7frames", "vrt", _vrt_sr(8, [8, 8, 8], 4, 16),
                 (32, 128, 128), test_sets=("Vid4",)),
        TaskSpec("004_VRT_videosr_bd_Vimeo_7frames", "vrt", _vrt_sr(8, [8, 8, 8], 4, 16),
                 (32, 128, 128), test_sets=("Vid4",)),
        TaskSpec("005_VRT_videodeblurring_DVD", "vrt", _vrt_restore(), (12, 256, 256),
                 test_sets=("DVD10",)),
        TaskSpec("006_VRT_videodeblurring_GoPro", "vrt", _vrt_restore(), (18, 192, 192),
                 test_sets=("GoPro11-part1", "GoPro11-part2")),
        TaskSpec("007_VRT_videodeblurring_REDS", "vrt", _vrt_restore(), (12, 256, 256),
                 test_sets=("REDS4",)),
        TaskSpec("008_VRT_videodenoising_DAVIS", "vrt", _vrt_restore(nonblind_denoising=True),
                 (12, 256, 256), default_sigma=50, test_sets=("Set8", "DAVIS-test")),
        TaskSpec("009_VRT_videofi_Vimeo_4frames", "vrt", vfi_kwargs, (0, 0, 0),
                 test_sets=("UCF101", "DAVIS-train")),
        TaskSpec("001_RVRT_videosr_bi_REDS_30frames", "rvrt", rvrt_sr, (100, 128, 128),
                 test_sets=("REDS4",)),
        TaskSpec("002_RVRT_videosr_bi_Vimeo_14frames", "rvrt", rvrt_sr, (0, 0, 0),
                 vimeo_mirror=True, test_sets=("Vid4",)),
        TaskSpec("003_RVRT_videosr_bd_Vimeo_14frames", "rvrt", rvrt_sr, (0, 0, 0),
                 vimeo_mirror=True, test_sets=("Vid4",)),
        TaskSpec("004_RVRT_videodeblurring_DVD_16frames", "rvrt", _rvrt(1, 192, [1, 3, 3, 3, 3, 3]), (0, 256, 256),
                 test_sets=("DVD10",)),
        TaskSpec("005_RVRT_videodeblurring_GoPro_16frames", "rvrt", _rvrt(1, 192, [1, 3, 3, 3, 3, 3]),
                 (0, 256, 256), test_sets=("GoPro11-part1", "GoPro11-part2")),
        TaskSpec("006_RVRT_videodenoising_DAVIS_16frames", "rvrt",
                 _rvrt(1, 192, [1, 3, 4, 6, 8, 4], nonblind_denoising=True), (0, 256, 256),
                 default_sigma=50, test_sets=("Set8", "DAVIS-test")),
    ]


# BasicVSR++ releases: (file stem, mid_channels, num_blocks, is_low_res_input, Vimeo mirror test, test sets).
# REDS4, Vimeo-90K BI/BD and the NTIRE 2021 models: mmagic's configs/basicvsr_pp (metafile.yml, README), files under
# BASICVSRPP_RELEASE. DVD and GoPro deblurring: the BasicVSR++ repository's configs (c64n15, full-resolution input);
# its README publishes the deblurring (and denoising) weights in a Dropbox folder (BASICVSRPP_AUTHOR_FOLDER), and
# neither mmagic's nor that repository's metafile lists them. Their file names are the ones third-party mirrors use
# (HolyWu/vs-basicvsrpp's "model" release, download scripts); a download.openmmlab.com URL of the same name that
# some scripts use is UNVERIFIED (not in any OpenMMLab listing), so it is not given as their URL.
# Every file name ends in the first 8 hex digits of the file's SHA-256 (mmcv's publish_model rule): that prefix is
# checked. Full digests are not published by OpenMMLab; REDS4's is the one reported identically by independent
# public download scripts (starting with its name's prefix), so it is checked in full.
_BASICVSRPP = [
    ("basicvsr_plusplus_c64n7_8x1_600k_reds4_20210217-db622b2f", 64, 7, True, False, ("REDS4",)),
    ("basicvsr_plusplus_c64n7_8x1_300k_vimeo90k_bi_20210305-4ef437e2", 64, 7, True, True, ("Vid4",)),
    ("basicvsr_plusplus_c64n7_8x1_300k_vimeo90k_bd_20210305-ab315ab1", 64, 7, True, True, ("Vid4",)),
    ("basicvsr_plusplus_deblur_dvd-ecd08b7f", 64, 15, False, False, ("DVD10",)),
    ("basicvsr_plusplus_deblur_gopro-3c5bb9b5", 64, 15, False, False, ("GoPro11-part1", "GoPro11-part2")),
    ("basicvsr_plusplus_c128n25_ntire_decompress_track1_20210223-7b2eba02", 128, 25, False, False, ()),
    ("basicvsr_plusplus_c128n25_ntire_decompress_track2_20210314-eeae05e6", 128, 25, False, False, ()),
    ("basicvsr_plusplus_c128n25_ntire_decompress_track3_20210304-6daf4a40", 128, 25, False, False, ()),
    ("basicvsr_plusplus_c128n25_ntire_vsr_20210311-1ff35292", 128, 25, True, False, ("REDS4",)),
]


BASICVSRPP_AUTHOR_FOLDER = "https://www.dropbox.com/sh/gopo637rbutlxde/AACGnXDlvQMjwfCey3m2g34za?dl=0"
_BASICVSRPP_IN_AUTHOR_FOLDER = ("basicvsr_plusplus_deblur_dvd-ecd08b7f", "basicvsr_plusplus_deblur_gopro-3c5bb9b5")
_BASICVSRPP_SHA256 = {
    "basicvsr_plusplus_c64n7_8x1_600k_reds4_20210217-db622b2f":
        "db622b2fd4caae0a4c63ab5e54f1cfef7a62a0f3b8ad101aba2eae068d928549",
}


def _basicvsrpp_specs() -> list[TaskSpec]:
    """Whole clips and frames, as the official evaluation (past ``cpu_cache_length`` frames the network keeps its
    features on the CPU); ``--tile 100 0 0 --tile_overlap 10 0 0`` bounds the device memory of longer videos."""
    return [TaskSpec(name, "basicvsrpp", {"mid_channels": mid, "num_blocks": blocks, "is_low_res_input": low_res,
                                          "cpu_cache_length": 100},
                     (0, 0, 0), (10, 20, 20), vimeo_mirror=mirror, test_sets=sets,
                     sha256=_BASICVSRPP_SHA256.get(name, ""), sha256_prefix=name.rsplit("-", 1)[-1],
                     published_in=BASICVSRPP_AUTHOR_FOLDER if name in _BASICVSRPP_IN_AUTHOR_FOLDER else "")
            for name, mid, blocks, low_res, mirror, sets in _BASICVSRPP]


# IART releases (file stems of the official test scripts, test_scripts/{BI,BD}/...): REDS BI with 6 and 16 training
# frames (tested on REDS4 and Vid4), Vimeo-90K BI and BD (tested on Vid4, Vimeo-90K-T, and UDM10 for BD). One
# constructor for all four (the scripts differ only in cpu_cache_length: 20 for UDM10, a memory setting that does not
# change the output).
IART_RELEASED = {"mid_channels": 64, "embed_dim": 120, "depths": [6, 6, 6], "num_heads": [6, 6, 6],
                 "window_size": [3, 8, 8], "num_frames": 3, "cpu_cache_length": 100, "is_low_res_input": True}
_IART = [("IART_REDS_BI_N6", ("REDS4", "Vid4")), ("IART_REDS_BI_N16", ("REDS4", "Vid4")),
         ("IART_Vimeo-90K_BI", ("Vid4",)), ("IART_Vimeo-90K_BD", ("Vid4",))]


def _iart_specs() -> list[TaskSpec]:
    """Whole clips and frames, as the official test scripts (``--tile 100 0 0 --tile_overlap 10 0 0`` bounds the
    device memory of longer videos); files from the authors' folder, no digest published."""
    return [TaskSpec(name, "iart", copy.deepcopy(IART_RELEASED), (0, 0, 0), (10, 20, 20), test_sets=sets,
                     published_in=IART_AUTHOR_FOLDER) for name, sets in _IART]


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (*_specs(), *_basicvsrpp_specs(), *_iart_specs())}


def testset_url(name: str) -> str:
    """Release URL of a test-set archive of the official VRT repository."""
    return f"{VRT_RELEASE}/testset_{name}.tar.gz"
