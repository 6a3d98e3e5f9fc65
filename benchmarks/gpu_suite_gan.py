"""The ``gan`` section of ``benchmarks/gpu_suite.py``: the GAN model's whole step (``models/model_gan.py``) with VRT
010's generator and U-Net discriminator at 1 clip, each in its own DDP wrapper (a one-rank group), in fp32, bf16 and
fp16 with one GradScaler for both optimizers. ``s`` is the suite (its ``device``, ``quick``, ``args.iters``,
``precisions``, ``problems``, ``over_budget``)."""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from benchmarks.gpu_suite_common import QUICK_CLIPS, QUICK_VRT, ROOT, seeded_rand, sync
from engine.options import parse_options
from models.memory_plan import train_clip
from utils import utils_option

GAN_RECIPE = 'options/vrt/010_train_vrt_videosr_realworld_gan.json'


def _gan_options(s: Any, tmp: str) -> dict[str, Any]:
    """VRT 010's GAN option file as written (quick: the small VRT and a narrow discriminator), no pretrained files,
    VGG19 weights generated into ``tmp`` up to the deepest perceptual layer."""
    from torchvision.models.vgg import cfgs, make_layers

    if s.quick:
        base = {'task': 'gan', 'model': 'gan', 'scale': 1, 'path': {'root': tmp}, 'netG': QUICK_VRT,
                'netD': {'net_type': 'discriminator_unet', 'base_nc': 8},
                'datasets': {'train': {'dataset_type': 'synthetic', 'num_frame': QUICK_CLIPS['vrt'][0],
                                       'gt_size': QUICK_CLIPS['vrt'][1], 'dataloader_batch_size': 1}},
                'train': {'F_feature_layer': [2, 7], 'F_weights': [0.1, 1.0], 'E_decay': 0.999}}
    else:
        base = utils_option.load_json(str(ROOT / GAN_RECIPE))
        base['path'] = {'root': tmp}
        base['netG']['spynet_path'] = None
    vgg = Path(tmp) / 'vgg19.pth'
    torch.manual_seed(3)
    layers = make_layers(cfgs['E'])[:max(base['train']['F_feature_layer']) + 1]
    torch.save({f'features.{k}': v for k, v in layers.state_dict().items()}, vgg)
    base['train'] = {**base['train'], 'F_vgg19_path': str(vgg), 'deterministic': False, 'D_init_iters': 0,
                     'D_update_ratio': 1, 'gan_warmup_iter': 0}
    return base


def gan_section(s: Any) -> dict[str, Any]:
    from models.model_gan import ModelGAN
    from utils.utils_dist import DistInfo

    rows = []
    iters, warmup = (1, 1) if s.quick else (s.args.iters, 2)
    precisions = s.precisions('vrt_010', ('fp32', 'bf16', 'fp16'), timed=True)  # CPU: fp16 takes 28 s a step
    backend = 'nccl' if s.device.type == 'cuda' else 'gloo'
    with tempfile.TemporaryDirectory() as tmp:
        base = _gan_options(s, tmp)
        lq, gt = train_clip(base)
        extra = {'device_id': s.device} if backend == 'nccl' else {}
        dist.init_process_group(backend, init_method=f'file://{tmp}/store', rank=0, world_size=1, **extra)
        try:
            for precision in precisions:
                if s.over_budget():
                    rows.append({'precision': precision, 'error': 'skipped: time budget'})
                    continue
                torch.manual_seed(0)
                amp = 'none' if precision == 'fp32' else precision
                opt = parse_options(None, base={**copy.deepcopy(base), 'datasets': {},
                                                 'train': {**base['train'], 'amp': amp}})
                model = ModelGAN(opt, DistInfo(0, 0, 1, s.device))
                model.dist = DistInfo(0, 0, 2, s.device)  # the DDP branch of wrap(); the group has one rank
                model.init_train()
                model.load_pretrained()
                updates: list[int] = []
                if model.scaler is not None:
                    scaler_update = model.scaler.update
                    model.scaler.update = lambda u=updates, f=scaler_update: u.append(1) or f()
                batch = {'L': seeded_rand((1, *lq), s.device, 1), 'H': seeded_rand((1, *gt), s.device, 2)}
                times = []
                for step in range(1, warmup + iters + 1):
                    if step == warmup + 1 and s.device.type == 'cuda':
                        torch.cuda.reset_peak_memory_stats(s.device)
                    sync(s.device)
                    t0 = time.perf_counter()
                    model.update_learning_rate(step)
                    model.train_step([batch], step)
                    sync(s.device)
                    times.append(time.perf_counter() - t0)
                vectors = [v for k, v in model.net_d.state_dict().items() if k.endswith(('._u', '._v'))]
                row = {'preset': 'vrt quick' if s.quick else 'vrt_010_gan', 'clip': 'x'.join(map(str, lq)),
                       'precision': precision, 'step_s': round(min(times[warmup:]), 4),
                       'peak_gb': round(torch.cuda.max_memory_allocated(s.device) / 2**30, 2)
                       if s.device.type == 'cuda' else None,
                       'finite': all(torch.isfinite(torch.tensor(v)) for v in model.current_log().values()),
                       'sn_fp32': bool(vectors) and all(v.dtype == torch.float32 and bool(torch.isfinite(v).all())
                                                         for v in vectors),
                       'ddp_units': sorted(label for label, unit in model.units.items()
                                           if isinstance(unit.train_net, nn.parallel.DistributedDataParallel)),
                       'scaler_updates': len(updates) if model.scaler is not None else None,
                       'scale': model.scaler.get_scale() if model.scaler is not None else None}
                rows.append(row)
                if not (row['finite'] and row['sn_fp32'] and row['ddp_units'] == ['D', 'G']) or \
                        row['scaler_updates'] not in (None, warmup + iters):
                    s.problems.append(f'gan {precision}: {row}')
                del model
                if s.device.type == 'cuda':
                    torch.cuda.empty_cache()
        finally:
            dist.destroy_process_group()
    return {'rows': rows}
