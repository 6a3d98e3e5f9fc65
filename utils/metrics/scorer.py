"""Scoring a clip with any metrics of the registry, streaming: :class:`MetricSuite` loads what the chosen metrics need
once per run (networks on the device), :class:`ClipScorer` scores one clip fed in consecutive chunks.

The contract (docs/metrics.md, /work/coord/METRICS_API.md):

- ``update(out, gt, first)`` takes frames ``first .. first+T-1`` of a clip, ``(T, 3, H, W)`` RGB float in [0, 1] on any
  device (``gt`` None for no-reference metrics), and returns one dict per frame with every per-frame metric that has a
  value there. Every metric sees the frames quantised as saved PNGs are, ``round(clamp(x, 0, 1) * 255)``.
- Temporal metrics (``tof``, ``tlp``) give frame t from frames (t-1, t): the scorer keeps the previous output and
  ground-truth frame across ``update`` calls, and :meth:`ClipScorer.prime` seeds it with the frame before a segment,
  so a clip scored in segments gives exactly the whole clip's values. Frame 0 of a clip (and the first frame of an
  unprimed scorer) has no key for them: absent, not NaN.
- ``finish()`` returns the per-clip values: the mean of each per-frame metric over the frames this scorer saw that
  have one, and ``vmaf`` (libvmaf's pooled mean; its per-frame values land in ``frame_values['vmaf']``).

LPIPS, LPIPS-VGG, DISTS and tLP run on the device, batched over frames off the CPU (:func:`frames_per_forward`);
PSNR/SSIM (KAIR's numpy code), NIQE, tOF (OpenCV) and VMAF (ffmpeg) run on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import torch

from utils.metrics import niqe as niqe_mod
from utils.metrics import temporal
from utils.metrics.perceptual import DISTS, LPIPS
from utils.metrics.registry import MetricError, MetricSpec
from utils.metrics.vmaf import VmafStream, ffmpeg_with_libvmaf
from utils.metrics.weights import load_weights
from utils.utils_image import frame_metrics

_KAIR = ("psnr", "ssim", "psnr_y", "ssim_y")

# Frames per forward of the metric networks off the CPU: as many as fit this many pixels (8 frames of 256 x 256 up
# to 512 x 512, 2 of 720p, 1 of 1080p), at most MAX_FRAMES_PER_FORWARD (a short chunk is padded up to the batch). On
# the CPU batching does not pay (benchmarks/RESULTS.md, "Metrics": the VGG forwards get slower), so it stays 1 there.
PIXELS_PER_FORWARD = 1 << 21
MAX_FRAMES_PER_FORWARD = 8


def frames_per_forward(device: torch.device, height: int, width: int) -> int:
    """Frames of ``height`` x ``width`` per metric-network forward on ``device``: 1 on the CPU; elsewhere as many as
    :data:`PIXELS_PER_FORWARD` holds, between 1 and :data:`MAX_FRAMES_PER_FORWARD`."""
    if device.type == "cpu":
        return 1
    return max(1, min(MAX_FRAMES_PER_FORWARD, PIXELS_PER_FORWARD // (height * width)))


class MetricSuite:
    """What the chosen metrics need for a run: their specs and the perceptual networks, loaded once on ``device``.

    Args:
        specs: from :func:`utils.metrics.resolve`.
        device: where LPIPS / DISTS / tLP run.
        weights_dir: the folder of the weight files (None: ``model_zoo/metrics``); fetch them first with
            :func:`utils.metrics.weights.ensure_weights` (on every rank).
        verify: check each weight file's SHA-256 (False only for weights of one's own, e.g. the tests').
        batch_frames: frames per network forward; None (the default): :func:`frames_per_forward` of the device and
            frame size. Every forward gets exactly this many frames (a shorter remainder is padded with copies of its
            last frame), because a convolution's rounding depends on the batch size (1e-7 apart at 1 and 4 frames)
            but not on a frame's neighbours in a batch of the same size: a frame's value does not depend on how a
            clip is cut into chunks, segments and processes, bit for bit.

    Raises:
        MetricError: a weight file is missing or has the wrong hash; vmaf asked for without libvmaf.
    """

    def __init__(self, specs: Sequence[MetricSpec], device: str | torch.device = "cpu",
                 weights_dir: str | os.PathLike | None = None, *, verify: bool = True,
                 batch_frames: int | None = None) -> None:
        self.specs = tuple(specs)
        self.names = tuple(s.name for s in self.specs)
        self.device = torch.device(device)
        if batch_frames is not None and batch_frames < 1:
            raise ValueError(f"batch_frames must be >= 1, got {batch_frames}")
        self.batch_frames = batch_frames
        self.nets: dict[str, torch.nn.Module] = {}

        loaded: dict[str, dict] = {}

        def load(key: str) -> dict:  # VGG16 serves LPIPS-VGG and DISTS: read and checked once
            if key not in loaded:
                loaded[key] = load_weights(key, weights_dir, verify)
            return loaded[key]

        if "lpips" in self.names or "tlp" in self.names:
            self.nets["lpips"] = LPIPS("alex", load("alexnet"), load("lpips_alex")).to(self.device)
        if "lpips_vgg" in self.names:
            self.nets["lpips_vgg"] = LPIPS("vgg", load("vgg16"), load("lpips_vgg")).to(self.device)
        if "dists" in self.names:
            self.nets["dists"] = DISTS(load("vgg16"), load("dists")).to(self.device)
        if "vmaf" in self.names:
            ffmpeg_with_libvmaf()

    def scorer(self, clip: str = "") -> ClipScorer:
        """A fresh :class:`ClipScorer` for one clip (``clip`` names it in error messages)."""
        return ClipScorer(self, clip=clip)

    def forward(self, fn: Callable[..., torch.Tensor | list[torch.Tensor]], *frames: torch.Tensor
                ) -> torch.Tensor | list[torch.Tensor]:
        """``fn`` over ``frames`` ((T, 3, H, W) each, on the device) in batches of one fixed size along T, its results
        (a (T, ...) tensor or a list of them) concatenated along T; the batch size is :attr:`batch_frames` or
        :func:`frames_per_forward`.

        cuDNN runs without autotuning or TF32 here, so that a value is the same in every process and on every run.
        """
        n, (height, width) = frames[0].shape[0], frames[0].shape[-2:]
        size = self.batch_frames or frames_per_forward(self.device, height, width)
        parts: list[torch.Tensor | list[torch.Tensor]] = []
        with torch.inference_mode(), torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True,
                                                                 allow_tf32=False):
            for start in range(0, n, size):
                batch = [f[start:start + size] for f in frames]
                keep = batch[0].shape[0]
                if keep < size:
                    batch = [torch.cat([b, b[-1:].expand(size - keep, *b.shape[1:])]) for b in batch]
                result = fn(*batch)
                parts.append(result[:keep] if isinstance(result, torch.Tensor) else [r[:keep] for r in result])
        if isinstance(parts[0], torch.Tensor):
            return torch.cat(parts)  # type: ignore[arg-type]
        return [torch.cat(layer) for layer in zip(*parts)]


def _quantize(x: torch.Tensor) -> torch.Tensor:
    """Frames as saved (uint8 levels), in the standard memory layout: a channels-last input would take other
    convolution kernels, whose rounding differs, and a frame's value must not depend on how the caller held it."""
    return (torch.round(x.float().clamp(0, 1) * 255) / 255).contiguous(memory_format=torch.contiguous_format)


def _uint8(x: torch.Tensor) -> np.ndarray:
    """(T, 3, H, W) quantised float -> (T, H, W, 3) uint8 RGB on the CPU."""
    return (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


class ClipScorer:
    """Streaming scores of one clip (see the module docstring for the contract).

    Args:
        specs: a :class:`MetricSuite` (shared by the clips of a run), or specs to build one from with ``device`` and
            ``weights_dir``.
        clip: the clip's name, for error messages.
    """

    def __init__(self, specs: MetricSuite | Sequence[MetricSpec], device: str | torch.device = "cpu",
                 weights_dir: str | os.PathLike | None = None, *, clip: str = "") -> None:
        self.suite = specs if isinstance(specs, MetricSuite) else MetricSuite(specs, device, weights_dir)
        self.clip = clip
        self.frame_values: dict[str, dict[int, float]] = {s.name: {} for s in self.suite.specs}
        self._next: int | None = None
        self._prev: dict | None = None  # what the temporal metrics keep of the previous frame (see _remember)
        self._seen = 0
        self._primed = False
        self._vmaf: VmafStream | None = None
        self._vmaf_first = 0

    @property
    def _temporal(self) -> bool:
        return "tof" in self.suite.names or "tlp" in self.suite.names

    def prime(self, prev_out: torch.Tensor, prev_gt: torch.Tensor | None, index: int | None = None) -> None:
        """Seed the temporal metrics with the frame before the first one :meth:`update` will get.

        Args:
            prev_out, prev_gt: (3, H, W) or (1, 3, H, W) in [0, 1]: that frame's output and ground truth.
            index: that frame's index in the clip (then the next ``update`` must start at ``index + 1``).

        Raises:
            MetricError: vmaf is among the metrics (it needs the whole clip in one scorer: see ``vmaf_clip``).
        """
        if "vmaf" in self.suite.names:
            raise MetricError("vmaf cannot continue a segment (its motion feature reads the next frame too): score the "
                              "whole clip in one scorer, or its saved frames with utils.metrics.vmaf.vmaf_clip")
        if self._seen:
            raise ValueError("prime() must come before the first update()")
        if self._temporal:
            if prev_gt is None:
                raise MetricError(f"tof/tlp need ground truth, which clip {self.clip!r} lacks")
            dev = self.suite.device
            out = _quantize(prev_out.reshape(1, *prev_out.shape[-3:]).to(dev))
            gt = _quantize(prev_gt.reshape(1, *prev_gt.shape[-3:]).to(dev))
            self._prev = self._remember(out, gt, *self._embed_pair(out, gt))
        self._primed = True
        self._next = None if index is None else index + 1

    def update(self, out: torch.Tensor, gt: torch.Tensor | None, first: int) -> list[dict[str, float]]:
        """Score frames ``first .. first+T-1``.

        Args:
            out: (T, 3, H, W) RGB float in [0, 1], any device.
            gt: the ground truth, same shape, or None when every chosen metric is no-reference.
            first: the clip index of ``out[0]``; it must continue the previous update (or the primed frame).

        Returns:
            T dicts ``{metric: value}``; a per-frame metric without a value at a frame has no key there.

        Raises:
            MetricError: ground truth missing for a full-reference metric.
            ValueError: shapes differ, or ``first`` does not continue the clip.
        """
        suite, names = self.suite, self.suite.names
        if out.ndim != 4 or out.shape[1] != 3:
            raise ValueError(f"output frames must be (T, 3, H, W), got {tuple(out.shape)}")
        if gt is None:
            full = [s.name for s in suite.specs if s.needs_gt]
            if full:
                raise MetricError(f"metrics {', '.join(full)} need ground truth, which clip {self.clip!r} lacks")
        elif gt.shape != out.shape:
            raise ValueError(f"output {tuple(out.shape)} and ground truth {tuple(gt.shape)} differ")
        if self._next is not None and first != self._next:
            raise ValueError(f"clip {self.clip!r}: update(first={first}) does not continue frame {self._next - 1}")
        n = out.shape[0]
        rows: list[dict[str, float]] = [{} for _ in range(n)]
        q_out = _quantize(out.to(suite.device))
        q_gt = _quantize(gt.to(suite.device)) if gt is not None else None
        u8_out = _uint8(q_out) if {"niqe", "vmaf"} & set(names) else None
        u8_gt = _uint8(q_gt) if "vmaf" in names else None

        kair = [k for k in _KAIR if k in names]
        if kair:
            o_cpu, g_cpu = out.detach().cpu(), gt.detach().cpu()
            for i in range(n):
                values = frame_metrics(o_cpu[i], g_cpu[i])
                rows[i].update({k: values[k] for k in kair})
        for name in ("lpips", "lpips_vgg", "dists"):
            if name in names:
                d = suite.forward(suite.nets[name], q_out, q_gt)
                for i, v in enumerate(d.tolist()):
                    rows[i][name] = v
        if "niqe" in names:
            for i in range(n):
                rows[i]["niqe"] = niqe_mod.niqe_rgb(u8_out[i])
        if self._temporal:
            self._score_temporal(rows, q_out, q_gt)
        if "vmaf" in names:
            self._feed_vmaf(u8_out, u8_gt, first)

        for i, row in enumerate(rows):
            for k, v in row.items():
                self.frame_values[k][first + i] = v
        self._seen += n
        self._next = first + n
        return rows

    def _embed_pair(self, q_out: torch.Tensor, q_gt: torch.Tensor) -> tuple[list | None, list | None]:
        """tLP's LPIPS features of the centre-cropped frames (batched as :meth:`MetricSuite.forward` does), or None
        without tlp."""
        if "tlp" not in self.suite.names:
            return None, None
        net = self.suite.nets["lpips"]
        top, left, h, w = temporal.crop_box(*q_out.shape[-2:])
        embs = [self.suite.forward(net.embed, seq[:, :, top:top + h, left:left + w]) for seq in (q_out, q_gt)]
        return embs[0], embs[1]  # type: ignore[return-value]

    def _remember(self, q_out: torch.Tensor, q_gt: torch.Tensor, emb_out: list | None, emb_gt: list | None) -> dict:
        """What the next pair (t-1, t) needs of the last frame t-1 of ``q_out`` / ``q_gt``."""
        state = {}
        if "tof" in self.suite.names:
            state["gray"] = (temporal.gray(_uint8(q_out[-1:])[0]), temporal.gray(_uint8(q_gt[-1:])[0]))
        if emb_out is not None:
            state["emb"] = ([f[-1:] for f in emb_out], [f[-1:] for f in emb_gt])
        return state

    def _score_temporal(self, rows: list[dict[str, float]], q_out: torch.Tensor, q_gt: torch.Tensor) -> None:
        """tOF / tLP of the pairs (t-1, t) that end in this chunk; its last frame becomes the previous one."""
        prev, names = self._prev, self.suite.names
        skip = 0 if prev is not None else 1  # without a previous frame, row 0 has no pair
        if "tof" in names:
            g_out = [temporal.gray(f) for f in _uint8(q_out)]
            g_gt = [temporal.gray(f) for f in _uint8(q_gt)]
            if prev is not None:
                g_out, g_gt = [prev["gray"][0], *g_out], [prev["gray"][1], *g_gt]
            for j in range(1, len(g_out)):
                rows[j - 1 + skip]["tof"] = temporal.tof(g_out[j - 1], g_out[j], g_gt[j - 1], g_gt[j])
        emb_out, emb_gt = self._embed_pair(q_out, q_gt)
        if emb_out is not None:
            if prev is not None:
                emb_out = [torch.cat(p) for p in zip(prev["emb"][0], emb_out)]
                emb_gt = [torch.cat(p) for p in zip(prev["emb"][1], emb_gt)]
            net = self.suite.nets["lpips"]
            for j in range(len(emb_out[0]) - 1):
                # one pair at a time: a batched reduction rounds differently with the batch size, and a pair's value
                # must not depend on where the clip was cut
                d_out, d_gt = (float(net.distance([f[j:j + 1] for f in e], [f[j + 1:j + 2] for f in e]))
                               for e in (emb_out, emb_gt))
                rows[j + skip]["tlp"] = temporal.tlp(d_gt, d_out)
        self._prev = self._remember(q_out, q_gt, emb_out, emb_gt)

    def _feed_vmaf(self, u8_out: np.ndarray, u8_gt: np.ndarray, first: int) -> None:
        if self._vmaf is None:
            self._vmaf = VmafStream(*u8_out.shape[1:3], threads=torch.get_num_threads())
            self._vmaf_first = first
        for o, g in zip(u8_out, u8_gt):
            self._vmaf.add(niqe_mod.rgb_to_y(o).astype(np.uint8), niqe_mod.rgb_to_y(g).astype(np.uint8))

    def finish(self) -> dict[str, float]:
        """Per-clip values: the mean of each per-frame metric over the frames seen that have one, and ``vmaf``.

        Raises:
            MetricError: the clip had fewer frames than a metric needs (counting a primed frame).
        """
        frames = self._seen + (1 if self._primed else 0)
        short = [f"{s.name} needs {s.min_frames}" for s in self.suite.specs if frames < s.min_frames]
        if short:
            raise MetricError(f"clip {self.clip!r} has {frames} frame{'s' if frames != 1 else ''}, too few for "
                              f"{'; '.join(short)}")
        result = {}
        for spec in self.suite.specs:
            values = self.frame_values[spec.name]
            if spec.per_frame and values:
                result[spec.name] = float(np.mean(list(values.values())))
        if self._vmaf is not None:
            per_frame, pooled = self._vmaf.finish()
            self._vmaf = None
            self.frame_values["vmaf"] = {self._vmaf_first + i: v for i, v in enumerate(per_frame)}
            result["vmaf"] = pooled
        return result
