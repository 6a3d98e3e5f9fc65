"""Validation during training, sharded over all ranks, with KAIR's log lines.

Clip ``i`` of the test set is restored by rank ``i % world_size`` (no rank idles, none waits forever when the
clips do not divide); per-clip metric means are summed over ranks, so every process ends with the same numbers
as a single-process validation. Inference runs on the bare or EMA network, never through DDP.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from engine.eval_jobs import write_json
from engine.report import comparison_panels
from engine.scoring import (
    METRICS,
    MetricError,
    Scoring,
    average_lines,
    baseline_text,
    frame_names,
    mean_over_clips,
    metric_specs,
    tag,
    testing_lines,
)
from models.net_io import NetIO, net_io
from utils import utils_dist
from utils.metrics import check_clip_length
from utils.utils_dataloader import seeded_rng
from utils.utils_image import imwrite_rgb

logger = logging.getLogger(__name__)


def _strip(lq: torch.Tensor, out: torch.Tensor, gt: torch.Tensor | None) -> torch.Tensor:
    """``(3, H, 2W or 3W)`` image of the middle output frame: the input (bicubic-upsampled) | output | GT (when
    there is one), the report's comparison panels side by side."""
    t = out.shape[0] // 2
    panels = comparison_panels(lq[min(t, lq.shape[0] - 1)], out[t], gt[t] if gt is not None else None)
    return torch.from_numpy(np.concatenate(list(panels.values()), axis=1)).permute(2, 0, 1).float() / 255


def validate(model: Any, test_set: Dataset, *, step: int, epoch: int, save_img: bool, images_dir: str,
             tb: Any = None, tb_images: bool = True, quiet: bool = False, scoring: Scoring | None = None,
             prefix: str = "val/") -> dict[str, float] | None:
    """Restore every test clip (sharded over ranks), log per-clip and average metrics on rank 0.

    Args:
        model: a training model with ``infer(lq) -> (1, D', 3, H, W)`` CPU tensor.
        test_set: items ``{'L': (T, C, h, w), 'H': (T', 3, H, W) (optional), 'folder', 'lq_path', 'gt_path'}``.
        step: current step (for the log and image names).
        epoch: current epoch (for the log).
        save_img: write the restored frames to ``images_dir/<folder>/<frame>_<step>.png``.
        images_dir: ``experiments/<task>/images``.
        tb: the run's writer, :class:`utils.utils_trackers.RunLogger` (TensorBoard and the trackers, the same
            scalars and image), or a :class:`utils.utils_logger.TensorBoardWriter`, or ``None``.
        tb_images: also log an image strip (input | output | GT) of the first clip (``val.tb_images``).
        quiet: log nothing (the input baseline, which the caller logs in a line of its own: KAIR's per-clip and
            average lines are the model's alone, so that log parsers never read the baseline as a result).
        scoring: the metrics (default: KAIR's four); a clip without ground truth gets the no-reference ones only.
        prefix: of the scalar and image names (``val/``; ``val_<name>/`` for the test set ``test_<name>``).

    Returns:
        The mean over clips of each metric (each clip's mean over its frames first), on every rank; ``None`` when
        nothing was scored (no ground truth and no no-reference metric).
    """
    scoring = scoring if scoring is not None else default_scoring()
    specs = scoring.specs
    rank, world = utils_dist.get_rank(), utils_dist.get_world_size()
    n = len(test_set)  # type: ignore[arg-type]
    m = len(specs)
    table = torch.zeros(n, 2 * m, dtype=torch.float64)  # values, then has-a-value flags
    folders = [""] * n
    for idx in range(rank, n, world):
        item = test_set[idx]
        lq = item["L"]
        out = model.infer(lq[None])[0]  # (D', 3, H, W) CPU
        gt = item.get("H")
        folder = str(item.get("folder", f"{idx:03d}"))
        folders[idx] = folder
        if save_img:
            for name, frame in zip(frame_names(item.get("gt_path") or item.get("lq_path"), out.shape[0]), out):
                imwrite_rgb(os.path.join(images_dir, folder, f"{name}_{step}.png"), frame)
        use = scoring if gt is not None else scoring.no_reference()
        if use is not None and use.specs:
            try:
                _, values = use.score_clip(out, gt, folder)
            except ValueError as exc:
                raise ValueError(f"test clip {folder}: {exc}") from exc
            for j, spec in enumerate(specs):
                if spec.name in values:
                    table[idx, j], table[idx, m + j] = values[spec.name], 1.0
        if idx == 0 and tb is not None and tb_images:
            tb.image(f"{prefix}lq_output_gt", _strip(lq, out, gt), step)
    table = utils_dist.all_reduce_sum(table)
    folder_lists = [folders] if world == 1 else _gather_folders(folders)
    names = [next((fl[i] for fl in folder_lists if fl[i]), f"{i:03d}") for i in range(n)]
    clips = [{s.name: float(table[i, j]) for j, s in enumerate(specs) if table[i, m + j] > 0} for i in range(n)]
    for i in range(n if not quiet else 0):
        for line in testing_lines(names[i], i, n, clips[i], specs):
            logger.info("%s", line)
    result = mean_over_clips(clips, specs)
    if not result:
        return None
    if not quiet:
        for line in average_lines(result, specs):
            logger.info("<epoch:%3d, iter:%8s> %s", epoch, f"{step:,d}", line)
    if tb is not None:
        tb.scalars({tag(s): result[s.name] for s in specs if s.name in result}, step, prefix=prefix)
    return result


@functools.lru_cache(maxsize=1)
def default_scoring() -> Scoring:
    """KAIR's four on the CPU (no weights to load)."""
    return Scoring(metric_specs(None, True))


def _gather_folders(folders: list[str]) -> list[list[str]]:
    out: list[Any] = [None] * utils_dist.get_world_size()
    torch.distributed.all_gather_object(out, folders)
    return out


def input_baseline(lq: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The input as an estimate of the output: bicubic-upsampled LQ (SR), the LQ itself (deblurring/denoising),
    or the mean of the two middle input frames (interpolation).

    Args:
        lq: ``(1, T, C, h, w)``.
        like: an output tensor ``(1, T', 3, H, W)`` giving the target shape.
    """
    frames = lq[0, :, :3]
    if like.shape[1] != frames.shape[0]:
        mid = frames.shape[0] // 2
        frames = frames[max(mid - 1, 0):mid + 1].mean(0, keepdim=True)
    if frames.shape[-2:] != like.shape[-2:]:
        frames = F.interpolate(frames, size=like.shape[-2:], mode="bicubic", align_corners=False)
    return frames.clamp(0, 1)[None]


class InputBaseline:
    """Stands in for a model in :func:`validate`: the input itself as the restored video."""

    def __init__(self, scale: int, vfi: bool) -> None:
        self.scale, self.vfi = scale, vfi

    def infer(self, lq: torch.Tensor) -> torch.Tensor:
        frames = 1 if self.vfi else lq.shape[1]
        like = torch.empty(1, frames, 3, lq.shape[-2] * self.scale, lq.shape[-1] * self.scale)
        return input_baseline(lq, like)


# ------------------------------------------------------------------------------------------ training's validation
BEST_JSON = "best.json"


def set_prefix(key: str) -> str:
    """Scalar/image prefix of the test set ``key``: ``val/`` for ``test``, ``val_<name>/`` for ``test_<name>``."""
    return f"val{key[len('test'):]}/"


def _clip_outputs(test_set: Dataset, vfi: bool, center_frame_only: bool,
                  every: bool) -> list[tuple[str, int, bool]]:
    """``(clip, output frames, has ground truth)`` of every item (``every``; else of the first), from lazy items
    where the set has them (nothing decoded), else from the items themselves (under a fixed seed that leaves the
    random streams alone)."""
    lazy = getattr(test_set, "lazy_item", None)
    out = []
    for index in range(len(test_set) if every else min(1, len(test_set))):  # type: ignore[arg-type]
        if lazy is not None:
            item = lazy(index)
        else:
            with seeded_rng(0):
                item = test_set[index]
        frames = 1 if vfi or center_frame_only else len(item["L"])
        out.append((str(item.get("folder", f"{index:03d}")), frames, item.get("H") is not None))
    return out


def probe_frames(test_set: Dataset, index: int, scale: int, vfi: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What the metrics will meet in item ``index``, cheaply: the input baseline of its first two frames
    ``(T', 3, H, W)`` and the matching ground truth (``None`` without), read lazily where the set can."""
    lazy = getattr(test_set, "lazy_item", None)
    if lazy is not None:
        item = lazy(index)
        lq = torch.stack(list(itertools.islice(item["L"].frames(0), 2)))
        gt = torch.stack(list(itertools.islice(item["H"].frames(0), 2))) if item.get("H") is not None else None
    else:
        with seeded_rng(0):
            item = test_set[index]
        lq, gt = item["L"][:2], (item["H"][:2] if item.get("H") is not None else None)
    out = InputBaseline(scale, vfi).infer(lq[None])[0]
    return out, (gt[: out.shape[0]] if gt is not None else None)


class BestSoFar:
    """The best value of each metric on each test set so far (value and step, as BasicSR keeps them), the metric
    that picks the best step (``val.best_metric``), and ``models/best.json``.

    A full-reference best metric is read from the first test set with ground truth; a no-reference one from the
    first set without (the user's own footage) when there is one, else from the first set.

    Args:
        metric: ``val.best_metric``.
        sets: ``{set key: has ground truth}`` in ``datasets`` order.
        state: the ``'best'`` entry of the checkpoint being resumed (``None``: a new run); the format before
            ``val.metrics`` (``{'psnr': x, 'step': n}``) is read as the test set's PSNR.
    """

    def __init__(self, metric: str, sets: dict[str, bool], state: dict[str, Any] | None = None) -> None:
        self.spec = METRICS[metric]
        keys = list(sets)
        with_gt = [k for k in keys if sets[k]]
        without = [k for k in keys if not sets[k]]
        self.source = (with_gt or keys)[0] if self.spec.needs_gt else (without or keys)[0]
        self.first = keys[0] if keys else "test"
        self.values: dict[str, dict[str, float]] = {}
        state = dict(state or {})
        if "metrics" in state:
            self.values = {k: dict(v) for k, v in state["metrics"].items()}
        elif state.get("step") and math.isfinite(float(state.get("psnr", float("-inf")))):  # before val.metrics
            self.values = {f"{self.first}/psnr": {"value": float(state["psnr"]), "step": int(state["step"])}}

    def _key(self, set_key: str, name: str) -> str:
        return f"{set_key}/{name}"

    def update(self, results: dict[str, dict[str, float] | None], step: int) -> None:
        """Take one validation's results ``{set key: {metric: mean over clips}}``."""
        for set_key, values in results.items():
            for name, value in (values or {}).items():
                key = self._key(set_key, name)
                old = self.values.get(key)
                if math.isfinite(value) or value == float("inf"):
                    if METRICS[name].better(value, None if old is None else old["value"]):
                        self.values[key] = {"value": float(value), "step": step}

    @property
    def best(self) -> dict[str, float] | None:
        """``{'value', 'step'}`` of the best metric on its set (``None`` before it has a value)."""
        return self.values.get(self._key(self.source, self.spec.name))

    def lines(self, results: dict[str, dict[str, float] | None], models_dir: str) -> list[str]:
        """``Best LPIPS: 0.1234 at step 500`` for each metric of this validation (``on <set>`` after the first
        set); the best metric's line names its checkpoint file."""
        lines = []
        for set_key, values in results.items():
            for spec in (METRICS[n] for n in (values or {})):
                entry = self.values.get(self._key(set_key, spec.name))
                if entry is None:
                    continue
                where = "" if set_key == self.first else f" on {set_key}"
                line = f"Best {spec.label}{where}: {spec.format(entry['value'])} at step {entry['step']}"
                if spec is self.spec and set_key == self.source:
                    line += f" ({os.path.join(models_dir, str(entry['step']) + '_G.pth')})"
                lines.append(line)
        return lines

    def state(self) -> dict[str, Any]:
        """What the checkpoint keeps (``'best'`` of ``{step}_state.pth``)."""
        best = self.best
        return {"metric": self.spec.name, "set": self.source, "metrics": {k: dict(v) for k, v in self.values.items()},
                "psnr": float(self.values.get(self._key(self.first, "psnr"), {}).get("value", float("-inf"))),
                "step": int(best["step"]) if best else 0}

    def write_json(self, models_dir: str, saved: Any) -> None:
        """Write ``models/best.json`` atomically (rank 0): the best step, its value, its checkpoint (``null`` when
        ``saved(step)`` says that step is not saved) and every metric's best so far.

        Args:
            saved: ``saved(step) -> bool``: whether the checkpoint of that step exists or will be written.
        """
        best = self.best
        if best is None or utils_dist.get_rank() != 0:
            return
        step = int(best["step"])
        write_json(os.path.join(models_dir, BEST_JSON), {
            "metric": self.spec.name, "set": self.source, "higher_is_better": self.spec.higher_is_better,
            "step": step, "value": best["value"], "checkpoint": f"{step}_G.pth" if saved(step) else None,
            "metrics": self.values})


class Validation:
    """Validation during training: every ``datasets.test*`` set scored with ``val.metrics`` (a set without ground
    truth with the no-reference ones), the input baseline once per set, the best step (:class:`BestSoFar`).

    Build it on every rank before the run writes anything: it checks ``val.best_metric`` against ``val.metrics``
    and the clips' lengths, fetches missing metric weights (rank 0) and loads the metric networks.

    Args:
        opt: the parsed options.
        test_sets: ``{key: dataset}`` of the ``datasets.test*`` sections, in order.
        device: where the metric networks run (the training device).
        io: what the network eats and gives (scale; one output frame per clip for frame interpolation).
        state: the ``'best'`` entry of the checkpoint being resumed.

    Raises:
        MetricError: one line (a bad ``val.best_metric``, a clip too short for a metric, weights missing offline
            or with the wrong SHA-256, vmaf without libvmaf).
    """

    def __init__(self, opt: dict[str, Any], test_sets: dict[str, Dataset], device: torch.device, io: NetIO,
                 state: dict[str, Any] | None = None) -> None:
        val = opt["val"]
        self.opt, self.sets = opt, test_sets
        self.models_dir = opt["path"]["models"]
        specs = metric_specs(val["metrics"], True)
        if val["best_metric"] not in {s.name for s in specs}:
            raise MetricError(f"val.best_metric {val['best_metric']!r} is not one of val.metrics "
                              f"({', '.join(s.name for s in specs)}): add it there or pick one of them")
        every = any(s.min_frames > 1 for s in specs)  # clip lengths matter: look at every clip (else the first)
        vfi = io.frame_interpolation
        clips = {k: _clip_outputs(d, vfi, bool(val["center_frame_only"]), every) for k, d in test_sets.items()}
        has_gt = {k: bool(c) and all(g for _, _, g in c) for k, c in clips.items()}
        for key, items in clips.items():
            for clip, frames, gt in items:
                check_clip_length([s for s in specs if gt or not s.needs_gt], frames, f"datasets.{key}: {clip}")
        self.scoring = Scoring(specs, device, opt["path"].get("metric_weights"))
        self.set_scoring = {k: self._fitting(k, d, io, has_gt[k]) for k, d in test_sets.items()}
        self.best = BestSoFar(val["best_metric"], has_gt, state)
        self.baselines_logged: set[str] = set()

    def _fitting(self, key: str, data: Dataset, io: NetIO, has_gt: bool) -> Scoring:
        """The metrics that can score this set's frames: each is tried on the input baseline of the first two frames
        of the set's first clip, and one that refuses their size (NIQE below 96 x 96, tOF/tLP below 48 x 48) is left
        out for this set, with one warning; the others keep it."""
        if not len(data):  # type: ignore[arg-type]
            return self.scoring
        out, gt = probe_frames(data, 0, io.scale, io.frame_interpolation)
        refused = self.scoring.unfit(out, gt if has_gt else None)
        if not refused:
            return self.scoring
        if utils_dist.get_rank() == 0:
            for name, why in refused.items():
                logger.warning("val.metrics: %s is left out on datasets.%s (%s)", name, key, why)
        keep = [s.name for s in self.scoring.specs if s.name not in refused]
        return self.scoring.subset(keep) or Scoring([], self.scoring.device, fetch=False)

    def write_best(self, saved: Any) -> None:
        """Rewrite ``models/best.json`` from the best so far (e.g. from a resumed checkpoint's state)."""
        self.best.write_json(self.models_dir, saved)

    def run(self, model: Any, step: int, epoch: int, tb: Any, saved: Any) -> dict[str, float] | None:
        """Validate on every test set, log the lines and the best so far, update ``best.json``; returns the first
        set's means (``None`` when nothing was scored).

        Args:
            saved: ``saved(step) -> bool``: whether the checkpoint of a step is (or will be) on disk.
        """
        val, paths = self.opt["val"], self.opt["path"]
        io = net_io(model.net_g)
        results: dict[str, dict[str, float] | None] = {}
        for position, (key, data) in enumerate(self.sets.items()):
            if position:
                logger.info("Validation on datasets.%s (%d clip%s):", key, len(data), "s" if len(data) != 1 else "")
            if key not in self.baselines_logged:
                base = validate(InputBaseline(io.scale, io.frame_interpolation), data, step=step, epoch=epoch,
                                save_img=False, images_dir="", tb=None, quiet=True, scoring=self.set_scoring[key])
                if base is not None:
                    logger.info("%s", baseline_text(base, self.set_scoring[key].specs))
                self.baselines_logged.add(key)
            images = paths["images"] if not position else os.path.join(paths["images"], key)
            results[key] = validate(model, data, step=step, epoch=epoch, save_img=val["save_img"], images_dir=images,
                                    tb=tb, tb_images=val["tb_images"], scoring=self.set_scoring[key],
                                    prefix=set_prefix(key))
        self.best.update(results, step)
        for line in self.best.lines(results, self.models_dir):
            logger.info("%s", line)
        self.best.write_json(self.models_dir, saved)
        return next(iter(results.values()), None)
