"""Experiment trackers (Weights & Biases, MLflow) beside TensorBoard, from the ``logger`` section of the options.

A run writes its scalars through one :class:`RunLogger`, which hands each call to TensorBoard and to every tracker,
so they all hold the same numbers under the same names at the same steps (``train/...`` from the loop's log line,
``val/...`` from validation, whatever fields the model reports). Rank 0 alone imports, starts and writes the
trackers. Their packages are optional extras (``pip install .[trackers]``), imported only when the options ask for
a tracker, never at import time. A tracker's run id is kept in the checkpoint state (``{step}_state.pth``,
``'trackers'``), so a resumed run continues the same tracker run.
"""

from __future__ import annotations

import abc
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from utils import utils_checkpoint as ckpt
from utils import utils_dist
from utils.utils_logger import TensorBoardWriter
from utils.utils_option import OptionError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# MLflow's limits: at most 100 params per batch call, param values of at most 6000 characters
MLFLOW_PARAMS_PER_BATCH = 100
MLFLOW_PARAM_LENGTH = 6000


class TrackerError(OptionError):
    """A tracker that the ``logger`` section asks for cannot be used (package missing, run refused), one line."""


def _import(package: str, key: str) -> Any:
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as exc:
        if exc.name != package:
            raise TrackerError(f"logger.{key}: cannot import '{package}': {exc}") from exc
        raise TrackerError(f"logger.{key} needs the '{package}' package: pip install {package} "
                           "(or pip install .[trackers])") from exc
    except ImportError as exc:
        raise TrackerError(f"logger.{key}: cannot import '{package}': {exc}") from exc


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def flat_options(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{'train.total_iter': 300000, ...}``: the nested options as dotted keys (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_options(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


class Tracker(abc.ABC):
    """One experiment tracker: imports its package when built; used on rank 0 only.

    Args:
        section: the tracker's resolved section of the options (``logger.<key>``).
        task: the ``task`` name (the default run name).
        task_dir: ``experiments/<task>`` (where a tracker keeps local files).
    """

    key: ClassVar[str]  # its section under ``logger``
    hint: ClassVar[str]  # what to check when the run cannot start

    def __init__(self, section: Mapping[str, Any], task: str, task_dir: str) -> None:
        self.section, self.task, self.task_dir = dict(section), task, task_dir

    @abc.abstractmethod
    def start(self, run_id: str | None, config: Mapping[str, Any]) -> str:
        """Open the tracker run ``run_id`` (``None``: a new run) and record the options ``config`` in it.

        Returns:
            The id of the open run (kept in the checkpoint state).
        """

    @abc.abstractmethod
    def log_scalars(self, values: Mapping[str, float], step: int) -> None:
        """Record ``{name: value}`` at optimisation step ``step``."""

    @abc.abstractmethod
    def log_image(self, tag: str, image: np.ndarray, step: int) -> None:
        """Record one image ``(H, W, 3)`` uint8 RGB under ``tag`` at step ``step``."""

    @abc.abstractmethod
    def finish(self, failed: bool = False) -> None:
        """Close the run (marked failed when the training ended with an error)."""


class WandbTracker(Tracker):
    """Weights & Biases: ``wandb.init(..., id=run_id, resume="allow")``; local files under ``experiments/<task>/wandb``
    (``WANDB_DIR`` when set)."""

    key = "wandb"
    hint = "run `wandb login`, or set logger.wandb.mode to \"offline\" and upload later with `wandb sync`"

    def __init__(self, section: Mapping[str, Any], task: str, task_dir: str) -> None:
        super().__init__(section, task, task_dir)
        self._wandb = _import("wandb", self.key)
        self._run: Any = None

    def start(self, run_id: str | None, config: Mapping[str, Any]) -> str:
        s = self.section
        run_id = s["resume_id"] or run_id
        folder = None if os.environ.get("WANDB_DIR") else self.task_dir
        if folder:
            os.makedirs(folder, exist_ok=True)
        self._run = self._wandb.init(project=s["project"], entity=s["entity"], name=s["name"] or self.task,
                                     mode=s["mode"], id=run_id, resume="allow", dir=folder)
        self._run.config.update(dict(config), allow_val_change=True)  # a resume may change options
        return str(self._run.id)

    def log_scalars(self, values: Mapping[str, float], step: int) -> None:
        self._run.log(dict(values), step=step)

    def log_image(self, tag: str, image: np.ndarray, step: int) -> None:
        self._run.log({tag: self._wandb.Image(image)}, step=step)

    def finish(self, failed: bool = False) -> None:
        if self._run is not None:
            self._run.finish(exit_code=1 if failed else 0)
            self._run = None


class MlflowTracker(Tracker):
    """MLflow through its client (no global active run): metrics with their step; the options as params."""

    key = "mlflow"
    hint = "check logger.mlflow.tracking_uri"

    def __init__(self, section: Mapping[str, Any], task: str, task_dir: str) -> None:
        super().__init__(section, task, task_dir)
        self._mlflow = _import("mlflow", self.key)
        self._client: Any = None
        self._run_id = ""

    def start(self, run_id: str | None, config: Mapping[str, Any]) -> str:
        s = self.section
        client = self._client = self._mlflow.MlflowClient(tracking_uri=s["tracking_uri"])
        run = None
        if run_id:
            try:
                run = client.get_run(run_id)
            except self._mlflow.exceptions.MlflowException as exc:
                logger.warning("logger.mlflow: the checkpoint's run %s is not in %s (%s); starting a new run",
                               run_id, client.tracking_uri, _one_line(exc))
        if run is None:
            name = s["experiment"] or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
            run = client.create_run(experiment_id, run_name=s["run_name"] or self.task)
        else:
            client.update_run(run.info.run_id, status="RUNNING")
        self._run_id = run.info.run_id
        self._log_params(run.data.params, config)
        return str(self._run_id)

    def _log_params(self, existing: Mapping[str, str], config: Mapping[str, Any]) -> None:
        params = {k: (v if isinstance(v, str) else json.dumps(v))[:MLFLOW_PARAM_LENGTH]
                  for k, v in flat_options(config).items()}
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        if changed:  # MLflow refuses to change a param of a run
            logger.info("logger.mlflow: run %s keeps the first values of the changed options %s", self._run_id,
                        ", ".join(changed))
        new = [self._mlflow.entities.Param(k, v) for k, v in params.items() if k not in existing]
        for i in range(0, len(new), MLFLOW_PARAMS_PER_BATCH):
            self._client.log_batch(self._run_id, params=new[i:i + MLFLOW_PARAMS_PER_BATCH])

    def log_scalars(self, values: Mapping[str, float], step: int) -> None:
        stamp = int(time.time() * 1000)
        metrics = [self._mlflow.entities.Metric(k, float(v), stamp, step) for k, v in values.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def log_image(self, tag: str, image: np.ndarray, step: int) -> None:
        self._client.log_image(self._run_id, image, key=tag.replace("/", "_"), step=step)

    def finish(self, failed: bool = False) -> None:
        if self._client is not None:
            self._client.set_terminated(self._run_id, status="FAILED" if failed else "FINISHED")
            self._client = None


TRACKERS: dict[str, type[Tracker]] = {"wandb": WandbTracker, "mlflow": MlflowTracker}


def _agreed(func: Callable[[], T]) -> T | None:
    """``func()`` on rank 0 (``None`` elsewhere); a :class:`TrackerError` there is raised on every rank, so no rank
    goes on to wait in a collective for a rank 0 that has stopped."""
    return utils_dist.rank0_first(func, catch=(TrackerError,), raise_as=lambda _, text: TrackerError(text))


def _sections(opt: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (opt.get("logger") or {}).items() if v is not None}


def create_trackers(opt: Mapping[str, Any]) -> list[Tracker]:
    """The trackers that ``opt['logger']`` asks for, with their packages imported (rank 0; ``[]`` elsewhere).

    Call it on every rank, before the run is built, so a missing package stops the run at once.

    Raises:
        TrackerError: on every rank: a package is missing (``logger.wandb needs the 'wandb' package: ...``).
    """
    sections = _sections(opt)
    if not sections:  # the same options on every rank: no collective needed
        return []
    task, task_dir = opt["task"], opt["path"]["task"]
    return _agreed(lambda: [TRACKERS[k](v, task, task_dir) for k, v in sections.items()]) or []


def start_trackers(trackers: Sequence[Tracker], saved_ids: Mapping[str, str] | None,
                   config: Mapping[str, Any]) -> dict[str, str]:
    """Open every tracker's run (rank 0) and record the options in it; call on every rank.

    The global random states are left as they were, so a run with trackers computes the same numbers as one
    without, and a resume stays exact.

    Args:
        trackers: from :func:`create_trackers`.
        saved_ids: ``{key: run id}`` kept in the checkpoint being resumed (``None``: a new run).
        config: the resolved options.

    Returns:
        ``{key: run id}`` to keep in the checkpoint state: the open runs, plus saved ids of trackers not used now.

    Raises:
        TrackerError: on every rank: a run could not be started (one line with what to check).
    """
    saved = dict(saved_ids or {})
    if not _sections(config):
        return saved

    def start_all() -> dict[str, str]:
        rng = ckpt.capture_rng_state()
        ids = dict(saved)
        started: list[Tracker] = []
        try:
            for tracker in trackers:
                try:
                    ids[tracker.key] = tracker.start(saved.get(tracker.key), config)
                except Exception as exc:  # whatever the tracker's library raises becomes one line
                    for other in started:
                        other.finish(failed=True)
                    raise TrackerError(f"logger.{tracker.key}: cannot start the run: {_one_line(exc)} "
                                       f"({tracker.hint})") from exc
                started.append(tracker)
                same = ids[tracker.key] == saved.get(tracker.key)
                logger.info("Tracker %s: run %s%s", tracker.key, ids[tracker.key],
                            " (the checkpoint's, continued)" if same else "")
        finally:
            ckpt.restore_rng_state(rng)
        return ids

    ids = _agreed(start_all)
    return ids if ids is not None else saved


class RunLogger:
    """The one writer of a run's scalars and images: TensorBoard and every started tracker get the same
    ``{name: value}`` (and the same validation image) at the same step. Same interface as
    :class:`utils.utils_logger.TensorBoardWriter`; every method is a no-op on ranks other than 0.

    Args:
        tensorboard: the run's TensorBoard writer.
        trackers: started trackers (rank 0).
    """

    def __init__(self, tensorboard: TensorBoardWriter, trackers: Sequence[Tracker] = ()) -> None:
        self.tensorboard = tensorboard
        self.trackers = list(trackers)

    def scalars(self, values: Mapping[str, float], step: int, prefix: str = "") -> None:
        """Log ``{prefix + name: value}`` at ``step`` everywhere."""
        named = {f"{prefix}{k}": float(v) for k, v in values.items()}
        self.tensorboard.scalars(named, step)
        for tracker in self.trackers:
            try:
                tracker.log_scalars(named, step)
            except Exception as exc:  # a tracker outage must not stop the training
                logger.warning("logger.%s: step %d was not logged: %s", tracker.key, step, _one_line(exc))

    def image(self, tag: str, image: torch.Tensor | np.ndarray, step: int) -> None:
        """Log one image ``(3, H, W)`` float in [0, 1] to TensorBoard and the trackers (W&B: a ``wandb.Image``
        under ``tag``; MLflow: ``log_image`` with key ``tag`` with ``/`` as ``_``, MLflow's image-key rule)."""
        self.tensorboard.image(tag, image, step)
        if not self.trackers:
            return
        chw = torch.as_tensor(image).detach().float().cpu().clamp(0, 1)
        rgb = chw.mul(255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
        for tracker in self.trackers:
            try:
                tracker.log_image(tag, rgb, step)
            except Exception as exc:  # a tracker outage must not stop the training
                logger.warning("logger.%s: the image %s of step %d was not logged: %s", tracker.key, tag, step,
                               _one_line(exc))

    def close(self) -> None:
        """Flush TensorBoard and close the tracker runs (marked failed when called while an exception unwinds)."""
        failed = sys.exc_info()[0] is not None
        self.tensorboard.close()
        for tracker in self.trackers:
            try:
                tracker.finish(failed)
            except Exception as exc:  # nor a failure to close a run
                logger.warning("logger.%s: the run was not closed cleanly: %s", tracker.key, _one_line(exc))
        self.trackers = []
