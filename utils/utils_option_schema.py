"""The option schema: every key of an option file outside ``netG`` and the dataset-specific keys, with its type,
its default (the only place that default is written) and what it does.

``netG`` keys are the network constructor's arguments (``models.select_network``), and each dataset class declares
its own keys in an ``OPTIONS`` dict of :class:`Opt` (``data/``); :data:`DATASET_COMMON` are the keys every dataset
section takes. ``docs/options.md`` is generated from all of these (``python scripts/gen_options_doc.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from utils.metrics.registry import DEFAULT_METRICS, METRICS, MetricError, resolve

ANY = object()  # type marker: any JSON value
REQUIRED = object()  # default marker: the key must be given
OPTIONAL = object()  # default marker: the key may be absent (no default is filled in)
NUM = (int, float)
OPT_STR = (str, type(None))
OPT_NUM = (int, float, type(None))
OPT_INT = (int, type(None))


@dataclass(frozen=True)
class Opt:
    """One option.

    Attributes:
        types: accepted Python types of the JSON value (a type, a tuple of types, or :data:`ANY`).
        default: filled in when the key is absent; :data:`REQUIRED` or :data:`OPTIONAL` for none.
        doc: what the option does (one or two sentences, for the generated reference).
        choices: the valid values, if restricted.
        refuse: returns why a value is not supported (a KAIR feature we do not implement), or ``None``.
        note: for KAIR keys that are accepted but have no effect here: why (logged once when the key is set).
    """

    types: Any
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    refuse: Callable[[Any], str | None] | None = None
    note: str | None = None


def _only_off(feature: str) -> Callable[[Any], str | None]:
    def refuse(value: Any) -> str | None:
        return None if value in (None, 0, False) else f"{feature} is not supported for VRT/RVRT; set it to null"
    return refuse


def _accum_steps(value: Any) -> str | None:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return "must be >= 1 or \"auto\""


def _metric_names(value: Any) -> str | None:
    if not value or not all(isinstance(v, str) for v in value):
        return f"must be a non-empty list of metric names ({', '.join(METRICS)})"
    try:
        resolve(value, have_gt=True)
    except MetricError as exc:
        return str(exc)
    return None


def _metric_name(value: Any) -> str | None:
    return _metric_names([value])


FREE = "free-form"  # a section whose keys are checked elsewhere (netG: constructor; datasets.*: dataset class)

SCHEMA: dict[str, Opt] = {
    # ---- top level
    "task": Opt(str, "vrt_experiment", "Experiment name: outputs go to `path.root/task/`; re-running the same "
                "task resumes it."),
    "model": Opt(str, "vrt", "Training model: `vrt` (VRT and RVRT, with fix_iter phases and tiled validation), "
                 "`gan` (as `vrt`, plus perceptual and adversarial losses against `netD`: KAIR's ModelGAN) or "
                 "`plain` (one pixel loss, whole-clip validation); `rvrt` is an alias of `vrt`.",
                 choices=("vrt", "rvrt", "gan", "plain")),
    "gpu_ids": Opt((list, str), "auto", "Informational.", note="the processes come from the launcher "
                   "(torchrun, srun), one per GPU; restrict GPUs with CUDA_VISIBLE_DEVICES"),
    "dist": Opt((bool, str), False, "Informational.", note="distributed mode comes from WORLD_SIZE"),
    "find_unused_parameters": Opt(bool, False, "DDP's `find_unused_parameters` (not needed by VRT/RVRT, costs a "
                                  "graph traversal per step)."),
    "use_static_graph": Opt(bool, False, "Informational.", note="DDP needs no static graph here: activation "
                            "checkpointing is non-reentrant and fix_iter re-wraps DDP"),
    "scale": Opt(int, 1, "Upscaling factor; also the default `scale` of every dataset section."),
    "n_channels": Opt(int, 3, "Image channels; also the default `n_channels` of every dataset section."),
    "merge_bn": Opt(bool, False, "KAIR's BatchNorm folding (VRT/RVRT have no BatchNorm).",
                    refuse=_only_off("merge_bn (BatchNorm folding)")),
    "merge_bn_startpoint": Opt(int, -1, "KAIR's BatchNorm folding start (unused: see `merge_bn`)."),
    "dist_backend": Opt(OPT_STR, None, "Process-group backend; default `nccl` with CUDA, else `gloo` "
                        "(environment: `VRT_DIST_BACKEND`).", choices=(None, "nccl", "gloo")),
    "dist_timeout": Opt(OPT_NUM, None, "Seconds any collective may wait before the job fails (bounds every hang); "
                        "null: the environment's `VRT_DIST_TIMEOUT`, else 1800."),
    "sync_bn": Opt(bool, False, "Convert BatchNorm layers to SyncBatchNorm under DDP (VRT/RVRT have none)."),
    # keys KAIR writes into its saved copies of an option file
    "opt_path": Opt(OPT_STR, OPTIONAL, "Written into saved copies (the file that was parsed)."),
    "is_train": Opt(bool, OPTIONAL, "Written into saved copies."),
    "num_gpu": Opt((int, str), OPTIONAL, "Written into saved copies (the job's WORLD_SIZE)."),
    "rank": Opt(int, OPTIONAL, "Written into KAIR's saved copies."),
    "world_size": Opt(int, OPTIONAL, "Written into KAIR's saved copies."),
    "command_line": Opt(str, OPTIONAL, "Written into saved copies (the command that started the run)."),
    # ---- path
    "path": Opt(dict, {}, "Where things are read and written."),
    "path.root": Opt(str, "experiments", "Folder holding one sub-folder per task."),
    "path.pretrained_netG": Opt(OPT_STR, None, "Weights to start from (`{'params': ...}`), used only when the "
                                "experiment has no checkpoint to resume."),
    "path.pretrained_netE": Opt(OPT_STR, None, "EMA weights to start from (default: a copy of the generator)."),
    "path.pretrained_optimizerG": Opt(OPT_STR, None, "Optimizer state to start from, with `pretrained_netG` "
                                      "(when `train.G_optimizer_reuse` is true)."),
    "path.pretrained_netD": Opt(OPT_STR, None, "Discriminator weights to start from (`model: gan`; `{'params': "
                                "...}`), used only when the experiment has no checkpoint to resume."),
    "path.pretrained_optimizerD": Opt(OPT_STR, None, "Discriminator optimizer state to start from (when "
                                      "`train.D_optimizer_reuse` is true)."),
    "path.metric_weights": Opt(str, "model_zoo/metrics", "Folder of the metric weight files (LPIPS, LPIPS-VGG, DISTS; "
                               "docs/metrics.md#weights); rank 0 downloads a missing one (SHA-256-checked). Copy "
                               "the folder to offline machines."),
    "path.task": Opt(OPT_STR, OPTIONAL, "Derived: `root/task`."),
    "path.log": Opt(OPT_STR, OPTIONAL, "Derived: the folder of `train.log`."),
    "path.options": Opt(OPT_STR, OPTIONAL, "Derived: where resolved copies of the options are saved."),
    "path.models": Opt(OPT_STR, OPTIONAL, "Derived: the checkpoint folder."),
    "path.images": Opt(OPT_STR, OPTIONAL, "Derived: validation images."),
    "path.tensorboard": Opt(OPT_STR, OPTIONAL, "Derived: TensorBoard logs."),
    # ---- sections checked elsewhere
    "datasets": Opt(dict, {}, "One section per dataset: keys starting with `train` or `test`."),
    "netG": Opt(dict, REQUIRED, "The generator: `net_type` plus constructor arguments."),
    "netE": Opt(dict, OPTIONAL, "Informational (KAIR); the EMA network is a copy of `netG`."),
    # ---- netD: the discriminator of `model: gan` (models/network_discriminator.py; KAIR's keys). Constructor
    # arguments take the constructor's defaults when left out.
    "netD": Opt(dict, OPTIONAL, "The discriminator of `model: gan` (required there): `net_type` plus constructor "
                "arguments."),
    "netD.net_type": Opt(str, "discriminator_unet", "The discriminator: the U-Net with spectral normalisation of "
                         "Real-ESRGAN, applied to every frame.", choices=("discriminator_unet",)),
    "netD.in_nc": Opt(int, OPTIONAL, "Input channels. Default: `3`."),
    "netD.base_nc": Opt(int, OPTIONAL, "Channels of the first level (x2, x4, x8 below). Default: `64`."),
    "netD.skip_connection": Opt(bool, OPTIONAL, "U-Net skip connections. Default: `true`."),
    "netD.init_type": Opt(str, OPTIONAL, "Weight initialisation: `default` (PyTorch's, as Real-ESRGAN) or "
                          "`orthogonal` (KAIR's recipes, gain `init_gain`). Default: `default`.",
                          choices=("default", "orthogonal")),
    "netD.init_gain": Opt(NUM, OPTIONAL, "Gain of the `orthogonal` initialisation. Default: `0.2`."),
    "netD.init_bn_type": Opt(ANY, OPTIONAL, "KAIR's BatchNorm initialisation.", note="the U-Net discriminator "
                             "has no BatchNorm"),
    "netD.n_layers": Opt(ANY, OPTIONAL, "KAIR's PatchGAN depth.", note="only for KAIR's PatchGAN discriminator"),
    "netD.norm_type": Opt(ANY, OPTIONAL, "KAIR's PatchGAN normalisation.", note="the U-Net discriminator is "
                          "always spectrally normalised"),
    # ---- train
    "train": Opt(dict, {}, "Training."),
    "train.G_lossfn_type": Opt(str, "charbonnier", "Pixel loss.", choices=("l1", "l2", "l2sum", "ssim",
                                                                             "charbonnier")),
    "train.G_lossfn_weight": Opt(NUM, 1.0, "Loss multiplier."),
    "train.G_charbonnier_eps": Opt(NUM, 1e-9, "Charbonnier epsilon, inside the square root."),
    "train.E_decay": Opt(NUM, 0, "EMA decay of the evaluation copy (0: no EMA; validation then uses the "
                         "generator)."),
    "train.E_param_strict": Opt(bool, True, "Load `path.pretrained_netE` strictly."),
    "train.G_param_strict": Opt(bool, True, "Load `path.pretrained_netG` strictly (false: matching names and "
                                "shapes only, the rest reported)."),
    "train.G_optimizer_type": Opt(str, "adam", "Optimizer.", choices=("adam", "adamw")),
    "train.G_optimizer_lr": Opt(NUM, 2e-4, "Base learning rate."),
    "train.G_optimizer_betas": Opt(list, [0.9, 0.999], "Adam betas."),
    "train.G_optimizer_wd": Opt(NUM, 0, "Weight decay."),
    "train.G_optimizer_clipgrad": Opt(OPT_NUM, None, "Clip the global gradient norm to this value (null: off)."),
    "train.G_optimizer_reuse": Opt(bool, False, "Restore the optimizer state on resume (false: it restarts, as in "
                                   "KAIR, and the resume is not exact)."),
    "train.fix_iter": Opt(int, 0, "Steps before which the `fix_keys` parameters are frozen (0: never frozen; "
                          "-1: never frozen but `fix_lr_mul` applies)."),
    "train.fix_lr_mul": Opt(NUM, 1.0, "LR multiplier of the `fix_keys` parameters."),
    "train.fix_keys": Opt(list, [], "Substrings of parameter names (e.g. `spynet`, `deform`)."),
    "train.total_iter": Opt(int, 300000, "Optimisation steps; re-run with a larger value to train further."),
    "train.G_scheduler_type": Opt(str, "CosineAnnealingWarmRestarts", "LR schedule (closed form of the step).",
                                  choices=("CosineAnnealingWarmRestarts", "MultiStepLR")),
    "train.G_scheduler_periods": Opt(OPT_INT, None, "Cosine period T_0 (null: `total_iter`)."),
    "train.G_scheduler_eta_min": Opt(NUM, 0, "Cosine minimum LR."),
    "train.G_scheduler_milestones": Opt(list, [], "MultiStepLR milestones."),
    "train.G_scheduler_gamma": Opt(NUM, 0.5, "MultiStepLR factor."),
    "train.G_scheduler_restart_weights": Opt(NUM, 1, "Cosine period growth T_mult (KAIR's use of this key)."),
    "train.G_regularizer_orthstep": Opt(OPT_INT, None, "KAIR's orthogonal regulariser (plain CNNs).",
                                        refuse=_only_off("G_regularizer_orthstep (orthogonal regularisation)")),
    "train.G_regularizer_clipstep": Opt(OPT_INT, None, "KAIR's weight clipping (plain CNNs).",
                                        refuse=_only_off("G_regularizer_clipstep (weight clipping)")),
    "train.checkpoint_test": Opt(int, 5000, "Validate every N steps (0: never)."),
    "train.checkpoint_save": Opt(int, 5000, "Save a checkpoint every N steps (and at the last step)."),
    "train.checkpoint_print": Opt(int, 200, "Log a training line every N steps."),
    "train.manual_seed": Opt(OPT_INT, None, "Seed (null: rank 0 draws one, all ranks use it)."),
    # ---- train: the GAN model (`model: gan`, models/model_gan.py; KAIR ModelGAN's keys and defaults). The other
    # models ignore these keys.
    "train.F_lossfn_type": Opt(str, "l1", "Perceptual loss criterion on VGG19 features (`model: gan`).",
                               choices=("l1", "l2")),
    "train.F_lossfn_weight": Opt(NUM, 1.0, "Perceptual loss weight (0: no perceptual loss, no VGG19)."),
    "train.F_feature_layer": Opt((int, list), 34, "VGG19 `features` indices whose outputs (before the ReLU) are "
                                 "compared: 34 = conv5_4; `[2, 7, 16, 25, 34]` = conv1_2 ... conv5_4."),
    "train.F_weights": Opt((int, float, list), 1.0, "Weight of each `F_feature_layer` (one number for all, or one "
                           "per layer)."),
    "train.F_use_input_norm": Opt(bool, True, "Normalise VGG19's input with the ImageNet mean and std."),
    "train.F_use_range_norm": Opt(bool, False, "VGG19's input is in [-1, 1] (our data is in [0, 1])."),
    "train.F_vgg19_path": Opt(str, "model_zoo/vgg/vgg19-dcbb9e9d.pth", "torchvision's VGG19 weights; rank 0 "
                              "downloads them (SHA-256-checked) when the file is missing "
                              "(`scripts/download_vgg.py`)."),
    "train.gan_type": Opt(str, "gan", "Adversarial loss: `gan` (vanilla), `ragan` (relativistic average), "
                          "`lsgan`, `hinge`, `wgan`, `softplusgan`.",
                          choices=("gan", "ragan", "lsgan", "hinge", "wgan", "softplusgan")),
    "train.D_lossfn_weight": Opt(NUM, 0.1, "Weight of the generator's adversarial loss."),
    "train.D_update_ratio": Opt(int, 1, "The generator is updated at steps divisible by this (D every step)."),
    "train.D_init_iters": Opt(int, 0, "Steps up to this train D alone (G is not updated), as KAIR."),
    "train.gan_warmup_iter": Opt(int, 0, "Steps up to this train G on the pixel and perceptual losses alone (D "
                                 "neither run nor updated): a pixel warm-up within one run."),
    "train.allow_no_adversarial_steps": Opt(bool, False, "Let a GAN run end before G's first adversarial step "
                                            "(`gan_warmup_iter`/`D_init_iters` at or beyond `total_iter`: the "
                                            "warm-up alone); otherwise such a run is refused before it starts."),
    "train.D_param_strict": Opt(bool, True, "Load `path.pretrained_netD` strictly."),
    "train.D_optimizer_type": Opt(str, "adam", "Discriminator optimizer.", choices=("adam", "adamw")),
    "train.D_optimizer_lr": Opt(NUM, 1e-4, "Discriminator base learning rate."),
    "train.D_optimizer_betas": Opt((list, type(None)), None, "Discriminator Adam betas (null: "
                                   "`G_optimizer_betas`)."),
    "train.D_optimizer_wd": Opt(NUM, 0, "Discriminator weight decay."),
    "train.D_optimizer_reuse": Opt(bool, False, "Restore the discriminator's optimizer state on resume (false: "
                                   "it restarts, as in KAIR, and the resume is not exact)."),
    "train.D_scheduler_type": Opt(OPT_STR, None, "Discriminator LR schedule (null: `G_scheduler_type`).",
                                  choices=(None, "CosineAnnealingWarmRestarts", "MultiStepLR")),
    "train.D_scheduler_periods": Opt(OPT_INT, None, "Cosine period (null: `G_scheduler_periods`)."),
    "train.D_scheduler_eta_min": Opt(OPT_NUM, None, "Cosine minimum LR (null: `G_scheduler_eta_min`)."),
    "train.D_scheduler_milestones": Opt((list, type(None)), None, "MultiStepLR milestones (null: "
                                        "`G_scheduler_milestones`)."),
    "train.D_scheduler_gamma": Opt(OPT_NUM, None, "MultiStepLR factor (null: `G_scheduler_gamma`)."),
    "train.D_scheduler_restart_weights": Opt(OPT_NUM, None, "Cosine period growth (null: "
                                             "`G_scheduler_restart_weights`)."),
    "train.amp": Opt(str, "none", "Autocast: `bf16`, or `fp16` with a GradScaler; deformable sampling, warping "
                     "and offsets stay fp32.", choices=("none", "bf16", "fp16")),
    "train.grad_accum_steps": Opt((int, str), 1, "Micro-batches per step; global batch = per-process batch x "
                                  "processes x this. `\"auto\"`: 1 for a new run; a resume on another number of "
                                  "processes keeps the checkpoint's per-process batch (memory-safe) and accumulates "
                                  "global batch / (per-process batch x processes).", refuse=_accum_steps),
    "train.compile": Opt(bool, False, "`torch.compile` the network before DDP wraps it."),
    "train.deterministic": Opt(bool, True, "Deterministic kernels: two runs of one command, and a resumed run, "
                               "are bit-identical (docs/reliability.md)."),
    "train.tf32": Opt(bool, False, "Allow TF32 in fp32 matmuls and convolutions on Ampere+ GPUs."),
    "train.dataloader_timeout": Opt(NUM, 0, "Seconds a training batch may take (0: no limit); a stall stops "
                                    "the run after each loader worker printed its stack."),
    # ---- val
    "val": Opt(dict, {}, "Validation during training (and the defaults of `main_test_vrt.py --opt`)."),
    "val.save_img": Opt(bool, False, "Write restored frames to `images/<clip>/<frame>_<step>.png`."),
    "val.tb_images": Opt(bool, True, "Log an image strip (input upscaled | output | GT) of the first clip of each "
                         "test set to TensorBoard and the trackers."),
    "val.metrics": Opt(list, list(DEFAULT_METRICS), "Metrics of every validation, any of the registry's "
                       "(docs/metrics.md): KAIR's four keep KAIR's log lines; the others get lines of their own, "
                       "TensorBoard/tracker scalars and a best-so-far line. A test set without ground truth is "
                       "scored with the no-reference ones (`niqe`).", refuse=_metric_names),
    "val.best_metric": Opt(str, "psnr", "The metric that picks the best step (`models/best.json`); higher or lower "
                           "is better as the registry says. Must be one of `val.metrics`.", refuse=_metric_name),
    "val.pad_seq": Opt(bool, False, "Repeat the last frame once before inference (its output is dropped)."),
    "val.flip_seq": Opt(bool, False, "Average with the restoration of the time-reversed clip."),
    "val.center_frame_only": Opt(bool, False, "Score only the centre output frame."),
    "val.num_frame_testing": Opt(OPT_INT, None, "Frames per temporal tile (0: the whole clip; null: the network's "
                                 "recommended tile, its `NetIO.temporal_tile`)."),
    "val.num_frame_overlapping": Opt(OPT_INT, None, "Frames shared by consecutive temporal tiles (null: the "
                                     "network's recommendation, e.g. 2 for VRT/RVRT, 10 for BasicVSR++)."),
    "val.size_patch_testing": Opt(int, 0, "LQ pixels per spatial tile, a multiple of the window (0: whole "
                                  "frames)."),
    "val.overlap_size": Opt(int, 20, "LQ pixels shared by neighbouring spatial tiles."),
    # ---- logger: experiment trackers (utils/utils_trackers.py; packages: pip install .[trackers])
    "logger": Opt(dict, {}, "Experiment trackers: each receives the scalars and validation numbers TensorBoard "
                  "gets (rank 0), and a resumed run continues its tracker run."),
    "logger.wandb": Opt((dict, type(None)), OPTIONAL, "Weights & Biases (package `wandb`); absent or null: off."),
    "logger.wandb.project": Opt(OPT_STR, None, "W&B project (null: `WANDB_PROJECT`, else W&B's default)."),
    "logger.wandb.entity": Opt(OPT_STR, None, "W&B user or team (null: `WANDB_ENTITY`, else your default)."),
    "logger.wandb.name": Opt(OPT_STR, None, "Run name (null: the `task` name)."),
    "logger.wandb.mode": Opt(OPT_STR, None, "`online`, `offline` (local files only; `wandb sync` uploads them) or "
                             "`disabled` (null: `WANDB_MODE`, else online).",
                             choices=(None, "online", "offline", "disabled")),
    "logger.wandb.resume_id": Opt(OPT_STR, None, "Continue this W&B run id (null: the id kept in the checkpoint "
                                  "being resumed, else a new run)."),
    "logger.mlflow": Opt((dict, type(None)), OPTIONAL, "MLflow (package `mlflow`); absent or null: off."),
    "logger.mlflow.tracking_uri": Opt(OPT_STR, None, "Tracking server or store, e.g. `http://host:5000` or "
                                      "`sqlite:///mlflow.db` (null: `MLFLOW_TRACKING_URI`, else MLflow's default)."),
    "logger.mlflow.experiment": Opt(OPT_STR, None, "Experiment name, created when absent (null: "
                                    "`MLFLOW_EXPERIMENT_NAME`, else `Default`)."),
    "logger.mlflow.run_name": Opt(OPT_STR, None, "Run name of a new run (null: the `task` name)."),
}

# keys every dataset section takes (the dataset classes add their own)
DATASET_COMMON: dict[str, Opt] = {
    "name": Opt(str, "dataset", "A label for the log."),
    "dataset_type": Opt(str, REQUIRED, "The dataset class (case-insensitive)."),
    "phase": Opt(str, OPTIONAL, "Derived from the section name (`train...` or `test...`).",
                 choices=("train", "test")),
    "scale": Opt(int, OPTIONAL, "Upscaling factor (default: the top-level `scale`)."),
    "n_channels": Opt(int, OPTIONAL, "Image channels (default: the top-level `n_channels`)."),
    "dataloader_shuffle": Opt(bool, True, "Shuffle training clips every epoch."),
    "dataloader_num_workers": Opt(int, 0, "Loader worker processes in total (split over the processes, as "
                                  "in KAIR)."),
    "dataloader_batch_size": Opt(int, 1, "Global batch: clips per step over all processes and accumulation "
                                 "steps, as in KAIR."),
}
