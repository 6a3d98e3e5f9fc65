"""Data for the metric tests: seeded stand-ins for the published weights (the tests never download) and real
photographs from scikit-image's wheel, degraded the ways restorations go wrong."""

from __future__ import annotations

import os

import numpy as np
import torch
from torchvision.models import alexnet
from torchvision.models.vgg import cfgs, make_layers

from utils.metrics.perceptual import _LPIPS_NETS, DISTS
from utils.metrics.weights import WEIGHTS


def make_weights(folder: str, seed: int = 0) -> str:
    """Write seeded weights under the published file names into ``folder`` (load them with ``verify=False``).

    The backbones are torchvision's architectures at their default initialisation (features only for VGG16:
    the classifier is never read); the LPIPS heads are non-negative, as the trained ones are; DISTS' alpha/beta are
    drawn as DISTS_pytorch initialises them.
    """
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    os.makedirs(folder, exist_ok=True)

    def save(key: str, state: dict) -> None:
        torch.save(state, os.path.join(folder, WEIGHTS[key].filename))

    save("alexnet", {k: v for k, v in alexnet(weights=None).state_dict().items() if k.startswith("features.")})
    save("vgg16", {f"features.{k}": v for k, v in make_layers(cfgs["D"]).state_dict().items()})
    for net, key in (("alex", "lpips_alex"), ("vgg", "lpips_vgg")):
        chans = _LPIPS_NETS[net][2]
        save(key, {f"lin{i}.model.1.weight": torch.rand(1, c, 1, 1, generator=g) * (400.0 / c)
                   for i, c in enumerate(chans)})
    n = sum(DISTS.CHANS)
    save("dists", {"alpha": 0.1 + 0.01 * torch.randn(1, n, 1, 1, generator=g),
                   "beta": 0.1 + 0.01 * torch.randn(1, n, 1, 1, generator=g)})
    return folder


def photo(name: str = "astronaut", size: tuple[int, int] | None = None) -> np.ndarray:
    """A scikit-image sample photograph as (H, W, 3) uint8 RGB, optionally centre-cropped to ``size``."""
    from skimage import data

    img = getattr(data, name)()
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    img = np.ascontiguousarray(img[..., :3])
    if size is not None:
        h, w = size
        top, left = (img.shape[0] - h) // 2, (img.shape[1] - w) // 2
        img = img[top:top + h, left:left + w]
    return img


def degrade(img: np.ndarray, kind: str, seed: int = 0) -> np.ndarray:
    """``img`` (H, W, 3) uint8 blurred, noised or JPEG-compressed, as restorations err."""
    import cv2

    if kind == "blur":
        return cv2.GaussianBlur(img, (0, 0), 1.5)
    if kind == "noise":
        rng = np.random.default_rng(seed)
        return np.clip(img + rng.normal(0, 12, img.shape), 0, 255).round().astype(np.uint8)
    if kind == "jpeg":
        ok, buf = cv2.imencode(".jpg", img[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 20])
        return cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1].copy()
    raise ValueError(kind)


def to_tensor(img: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 -> (3, H, W) float in [0, 1]; (T, H, W, 3) -> (T, 3, H, W)."""
    t = torch.from_numpy(np.ascontiguousarray(img)).float() / 255.0
    return t.permute(2, 0, 1) if t.ndim == 3 else t.permute(0, 3, 1, 2)


PAN_VIDEO = "pan_h264.mp4"  # in tests/fixtures/metrics: scripts/reference/make_metric_fixtures.py wrote it


def pan_frames(count: int = 10, size: tuple[int, int] = (288, 384)) -> np.ndarray:
    """A camera pan over skimage's astronaut (12 px right, 6 px down a frame): (T, H, W, 3) uint8 RGB."""
    img = photo("astronaut")
    h, w = size
    return np.stack([img[6 * t:6 * t + h, 12 * t:12 * t + w] for t in range(count)])


def encode_h264(frames: np.ndarray, path: str, crf: int = 32) -> None:
    """Write (T, H, W, 3) uint8 RGB frames as H.264 (libx264, B-frames, one thread: the same bytes every run)."""
    import av

    with av.open(path, "w") as box:
        stream = box.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.options = {"crf": str(crf), "preset": "medium", "threads": "1", "x264-params": "bframes=2:b-adapt=0"}
        stream.thread_count = 1
        for f in frames:
            box.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")))
        box.mux(stream.encode(None))


def decode_rgb(path: str) -> np.ndarray:
    """Decode a yuv420p video to (T, H, W, 3) uint8 RGB with our own BT.601 limited-range conversion (nearest chroma):
    the decoded planes are exact by the H.264 standard, and numpy converts them the same way on every CPU (swscale's
    SIMD paths need not)."""
    import av

    out = []
    with av.open(path) as box:
        for frame in box.decode(video=0):
            yuv = frame.to_ndarray(format="yuv420p")  # (H * 3 / 2, W): Y, then U and V quarter planes
            h, w = frame.height, frame.width
            y = yuv[:h].astype(np.float64)
            uv = yuv[h:].reshape(2, h // 2, w // 2).astype(np.float64).repeat(2, 1).repeat(2, 2) - 128.0
            c = (y - 16.0) * (255.0 / 219.0)
            k = 255.0 / 224.0
            r = c + 1.402 * k * uv[1]
            g = c - (0.114 * 1.772 / 0.587) * k * uv[0] - (0.299 * 1.402 / 0.587) * k * uv[1]
            b = c + 1.772 * k * uv[0]
            out.append(np.clip(np.rint(np.stack([r, g, b], -1)), 0, 255).astype(np.uint8))
    return np.stack(out)
