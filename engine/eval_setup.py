"""What ``main_test_vrt.py`` runs: its command line, the network and test settings (from ``--task`` or ``--opt``),
the test set, and the restoration of one test item at once.

The flags are the official VRT ``main_test_vrt.py``'s and KAIR's ``main_test_rvrt.py``'s, plus ours (see
:func:`build_parser`); :mod:`engine.evaluate` runs them.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from data.frame_sources import sigma_map
from data.select_dataset import define_test_set
from engine.options import parse_options
from models.memory_plan import cpu_tile
from models.model_zoo import TASKS, testset_url
from models.net_io import NetIO, net_io
from models.onnx_runner import OnnxNetwork
from models.select_network import define_G, define_network
from models.video_inference import infer_video, io_tiling
from utils import utils_checkpoint, utils_dist, utils_option
from utils.metrics import DEFAULT_METRICS, METRICS
from utils.metrics.weights import DEFAULT_WEIGHTS_DIR
from utils.utils_numerics import AMP_DTYPES

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface (the official flags first)."""
    p = argparse.ArgumentParser(description="Test VRT/RVRT: released models (--task) or our checkpoints (--opt).")
    p.add_argument("--task", type=str, default="001_VRT_videosr_bi_REDS_6frames",
                   help=f"released model: {', '.join(TASKS)}")
    p.add_argument("--sigma", type=int, default=None,
                   help="noise level (0-255) for denoising (default: 50 for --task, datasets.test.sigma of --opt)")
    p.add_argument("--folder_lq", type=str, default="testsets/REDS4/sharp_bicubic",
                   help="LQ frames (one sub-folder per clip), a video file or a folder of video files")
    p.add_argument("--folder_gt", type=str, default=None, help="ground truth, laid out like --folder_lq")
    p.add_argument("--tile", type=int, nargs="+", default=None,
                   help="frames, height, width of a tile; 0 = no tiling (default: the task's README setting)")
    p.add_argument("--tile_overlap", type=int, nargs="+", default=None, help="overlap of tiles (default 2 20 20)")
    p.add_argument("--num_workers", type=int, default=16, help="data-loading workers")
    p.add_argument("--save_result", action="store_true", help="write PNG frames to results/<task>/<clip>/")
    p.add_argument("--model_path", type=str, default=None,
                   help="weights file (default: model_zoo/{vrt,rvrt}/<task>.pth, or the newest checkpoint of --opt)")
    p.add_argument("--opt", type=str, default=None, help="a KAIR-format option file: build the net from its netG")
    p.add_argument("--onnx", type=str, default=None,
                   help="run this file of scripts/export.py with ONNX Runtime instead of the PyTorch network (the "
                        "test settings still come from --task/--opt; --tile defaults to the file's tile)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override keys of --opt, as in main_train_vrt.py (e.g. task=other val.overlap_size=32)")
    p.add_argument("--device", type=str, default=None, help="cuda, cuda:1 or cpu (default: cuda when available)")
    p.add_argument("--amp", choices=sorted(AMP_DTYPES), default="none", help="autocast dtype for inference")
    p.add_argument("--save_video", action="store_true",
                   help="also write each clip as a video, <save_dir>/<clip>.mp4 by default (see --video_codec), "
                        "with the input video's frame rate and audio")
    p.add_argument("--video_codec", choices=("h264", "h265", "ffv1", "png"), default="h264",
                   help="--save_video codec: h264 (.mp4, plays everywhere), h265 (.mp4, about half the size), ffv1 "
                        "(.mkv, lossless) or png (.mov, lossless)")
    p.add_argument("--video_crf", type=int, default=None,
                   help="--save_video quality of h264/h265, 0-51, lower is better (default 18 for h264, 20 for h265)")
    p.add_argument("--save_dir", type=str, default=None, help="output folder (default: results/<task>)")
    p.add_argument("--segment_frames", type=int, default=100,
                   help="cut clips into segments of about this many frames (cut at temporal tile ends): the unit of "
                        "resuming and of sharing a long video over processes")
    p.add_argument("--no_resume", action="store_true",
                   help="restore everything again, ignoring the complete segments recorded in <save_dir>/.eval_state")
    p.add_argument("--metrics", nargs="+", default=None, metavar="NAME",
                   help=f"metrics to compute, any of: {', '.join(METRICS)} (default with --folder_gt: "
                        f"{' '.join(DEFAULT_METRICS)}; without it only no-reference ones, e.g. niqe)")
    p.add_argument("--metric_weights", type=str, default=None,
                   help=f"folder of the metric weights (LPIPS, DISTS; default {DEFAULT_WEIGHTS_DIR}); missing files "
                        "are downloaded once, every file is SHA-256-checked")
    p.add_argument("--report", action="store_true",
                   help="also write <save_dir>/report.html: per-clip table, per-frame curves, a before/after "
                        "comparison per clip (one self-contained file)")
    return p


@dataclass
class TestSetup:
    """A ready network and how to run it (from ``--task`` or from ``--opt``); what the network eats is ``io``."""

    name: str
    net: nn.Module
    io: NetIO
    tile: tuple[int, int]
    tile_overlap: tuple[int, int]
    vimeo_mirror: bool
    sigma: int
    model_path: str = ""
    pad_seq: bool = False
    flip_seq: bool = False
    center_frame_only: bool = False

    @property
    def scale(self) -> int:
        return self.io.scale

    @property
    def vfi(self) -> bool:
        return self.io.frame_interpolation


def _two(values: list[int] | None, default: tuple[int, ...], flag: str) -> tuple[int, int]:
    values = list(default) if values is None else values
    if len(values) < 2 or any(v < 0 for v in values):
        raise ValueError(f"{flag} needs non-negative (frames, height[, width]) values, got {values}")
    if len(values) > 2 and values[2] != values[1]:
        logger.warning("%s: the width value %d is ignored (height and width share %d, as in the official script)",
                       flag, values[2], values[1])
    return int(values[0]), int(values[1])


def setup_model(args: argparse.Namespace) -> TestSetup:
    """Build the network, load its weights and resolve the test settings.

    Raises:
        ModelZooError: the released weight file is missing (the message gives its URL).
        utils_checkpoint.CheckpointError: a checkpoint that cannot be read or does not fit the network.
    """
    sigma_given = f"--sigma {args.sigma}" if args.sigma is not None else ""
    if args.opt:
        # the notes on keys without effect belong to the training log, not before every line of an evaluation
        opt = parse_options(args.opt, args.set, is_train=False, notes=[])
        net = OnnxNetwork(args.onnx) if args.onnx else define_G(opt)
        io = net_io(net)
        val = opt["val"]
        name = opt["task"]
        path = args.onnx or args.model_path or _newest_checkpoint(opt)
        # the val options' temporal tile and overlap, else the network's recommendation
        frames, frame_overlap = io.temporal_tiling(val["num_frame_testing"], val["num_frame_overlapping"])
        default_tile = (frames, val["size_patch_testing"])
        default_overlap = (frame_overlap, val["overlap_size"])
        # a denoising recipe's noise level is its test set's (KAIR: datasets.test.sigma)
        mirror, sigma = False, int((opt.get("datasets", {}).get("test") or {}).get("sigma") or 0)
        if not sigma_given and _written_test_sigma(args.opt, args.set):
            sigma_given = f"datasets.test.sigma {sigma}"
        val_rules = {k: bool(val[k]) for k in ("pad_seq", "flip_seq", "center_frame_only")}
    else:
        if args.task not in TASKS:
            raise ValueError(f"--task {args.task!r} is unknown; choose one of: {', '.join(TASKS)} "
                             "(or give --opt for a model of your own)")
        spec = TASKS[args.task]
        path = args.onnx or args.model_path or spec.default_model_path
        if not args.onnx:
            spec.check_model_file(path)
        net = OnnxNetwork(args.onnx) if args.onnx else define_network(spec.net_type, spec.net_kwargs())
        io = net_io(net)
        name = spec.name
        default_tile, default_overlap = spec.tile, spec.tile_overlap
        mirror, sigma = spec.vimeo_mirror, spec.default_sigma
        val_rules = {}
    sigma = int(args.sigma if args.sigma is not None else sigma)
    check_sigma(io, sigma, given=sigma_given)
    if args.tile is None and not isinstance(net, OnnxNetwork) and _runs_on_cpu(args):
        default_tile = tuple(default_tile[:2])  # a TaskSpec's tile is (frames, height, width); width follows height
        capped = cpu_tile(default_tile, io)  # a tile that fits a laptop's memory (models/memory_plan.py)
        if capped != default_tile:
            logger.info("CPU run: tiles of %d frames x %d pixels (the CPU default; --tile chooses)", *capped)
        default_tile = capped
    if isinstance(net, OnnxNetwork):  # the weights are in the graph, which runs on its own tile
        default_tile = (net.tile.frames, net.tile.height)
    else:
        logger.info("loading model from %s", path)
        utils_checkpoint.load_network(net, path, param_key="params", strict=True)
    return TestSetup(name=name, net=net.eval(), io=io, tile=_two(args.tile, default_tile, "--tile"),
                     tile_overlap=_two(args.tile_overlap, default_overlap, "--tile_overlap"), vimeo_mirror=mirror,
                     sigma=sigma, model_path=path, **val_rules)


def _runs_on_cpu(args: argparse.Namespace) -> bool:
    """``--device`` is the CPU, or none is given and this process has no GPU."""
    device = torch.device(args.device) if args.device else utils_dist.get_dist_info().device
    return device.type == "cpu"


def check_sigma(io: NetIO, sigma: int, given: str) -> None:
    """Refuse, before any work, a noise level that does not fit the network's input.

    A network with a noise-level map needs ``sigma > 0`` (the map is made from it); a noise level given to a
    network without one (``--sigma``, or ``datasets.test.sigma`` written in the option file, which training
    refuses too) would add a channel it cannot read.

    Args:
        io: what the network eats.
        sigma: the noise level the test would use (0: none).
        given: where a noise level was given, for the message (``'--sigma 30'``); ``''``: it was not.

    Raises:
        InputMismatch: naming both channel counts.
    """
    if io.noise_map and sigma <= 0:
        io.check_channels(io.image_chans, "the test input without --sigma (or datasets.test.sigma)")
    if given and sigma > 0 and not io.noise_map:
        io.check_channels(io.in_chans + 1, f"{given} (which adds a noise-level map)")


def _written_test_sigma(opt_path: str, overrides: list[str]) -> bool:
    """Whether the option file (or ``--set``) writes a non-zero ``datasets.test.sigma`` (a default filled by a
    dataset type, such as the synthetic sets' 30, is no noise level the user asked for)."""
    tree = utils_option.load_json(opt_path)
    utils_option.apply_overrides(tree, overrides)
    test = (tree.get("datasets") or {}).get("test")
    return isinstance(test, dict) and bool(test.get("sigma"))


def _newest_checkpoint(opt: dict[str, Any]) -> str:
    """The ``{step}_G.pth`` of the highest step in the experiment's ``models/`` folder."""
    models_dir = opt["path"]["models"]
    steps = [int(m.group(1)) for m in (re.fullmatch(r"(\d+)_G\.pth", f) for f in _listdir(models_dir)) if m]
    if not steps:
        raise utils_checkpoint.CheckpointError(f"no {{step}}_G.pth checkpoint in {models_dir}; pass --model_path")
    return os.path.join(models_dir, f"{max(steps)}_G.pth")


def _listdir(path: str) -> list[str]:
    return os.listdir(path) if os.path.isdir(path) else []


def build_test_set(args: argparse.Namespace, setup: TestSetup) -> Dataset:
    """The official script's dataset choice, plus video files."""
    lq, gt = args.folder_lq, args.folder_gt
    if not os.path.exists(lq):
        hint = ""
        if not args.opt and args.task in TASKS:
            hint = " Test sets of the official release: " + ", ".join(
                testset_url(n) for n in TASKS[args.task].test_sets)
        raise FileNotFoundError(f"--folder_lq {lq} does not exist (nothing is downloaded at run time).{hint}")
    sigma = setup.sigma if setup.io.noise_map else 0  # noise is only synthesised for denoising models
    # VRT's official script pads Vimeo-90K-T's 7 frames to 8 for its 8-frame windows; a network that takes any number
    # of frames (NetIO.input_multiple; IART, whose official script scores the 7 as they are) gets them as they are
    return define_test_set(lq, gt, sigma=sigma, vfi=setup.vfi, vimeo_mirror=setup.vimeo_mirror,
                           pad_vimeo=setup.io.input_multiple[0] > 1, vfi_frames=setup.io.clip_frames)


def restore_clip(setup: TestSetup, item: dict[str, Any], device: torch.device,
                 amp: torch.dtype | None, vimeo: bool) -> torch.Tensor:
    """Restore one test item: ``(D', 3, H, W)`` float32 on the CPU (the frames the official script scores)."""
    lq = item["L"]
    if setup.io.noise_map and lq.shape[1] == setup.io.image_chans:  # already-noisy input: add the sigma map
        lq = sigma_map(lq, setup.sigma / 255.0)
    setup.io.check_channels(lq.shape[1], f"test clip {item.get('folder', '')!r}".replace(" ''", ""))
    lq = lq[None]
    out = infer_video(setup.net, lq, **tiling_kwargs(setup, rules=not vimeo), device=device, autocast_dtype=amp)
    if setup.vfi:
        out = out[:, :1]
    elif vimeo and setup.vimeo_mirror:
        out = (out[:, 3:4] + out[:, 10:11]) / 2
    elif vimeo:
        out = out[:, 3:4]
    return out[0]




def tiling_kwargs(setup: TestSetup, rules: bool = True) -> dict[str, Any]:
    """The tiling keyword arguments of ``infer_video``/``stream_video``; ``rules``: apply the option file's
    ``val.pad_seq``/``flip_seq``/``center_frame_only`` (not to Vimeo-90K-T items, which have their own)."""
    return {**io_tiling(setup.io), "num_frame_testing": setup.tile[0],
            "num_frame_overlapping": setup.tile_overlap[0], "size_patch_testing": setup.tile[1],
            "overlap_size": setup.tile_overlap[1], "pad_seq": setup.pad_seq and rules,
            "flip_seq": setup.flip_seq and rules, "center_frame_only": setup.center_frame_only and rules}
