"""What the sections of ``benchmarks/gpu_suite.py`` share: the repository root, the quick mode's networks and clips,
device synchronisation and seeded inputs."""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# quick mode: VRT with head dims 20 and 30 (as 120/6 and 180/6; mutual attention in stage 1) and a small RVRT
# (two clips: guided deformable attention runs), on small clips
QUICK_VRT = {'net_type': 'vrt', 'upscale': 1, 'img_size': [2, 40, 40], 'window_size': [2, 4, 4],
             'depths': [2] + [1] * 8, 'indep_reconsts': [8], 'embed_dims': [40] * 7 + [60, 60],
             'num_heads': [2] * 9, 'pa_frames': 2, 'deformable_groups': 4, 'drop_path_rate': 0.0}
QUICK_RVRT = {'net_type': 'rvrt', 'upscale': 4, 'clip_size': 2, 'window_size': [2, 4, 4], 'num_blocks': [1, 1, 1],
              'depths': [1, 1, 1], 'embed_dims': [24, 24, 24], 'num_heads': [2, 2, 2], 'deformable_groups': 4,
              'attention_heads': 4, 'inputconv_groups': [1] * 6}
QUICK_CLIPS = {'vrt': (2, 40, 1), 'rvrt': (4, 36, 4)}  # frames, LQ size, scale


def sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def seeded_rand(shape: tuple[int, ...], device: torch.device, seed: int = 0) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)).to(device)
