"""Procedural videos for the built-in demo and the tests: no download, no files on disk.

The generator (:class:`SyntheticScene`) draws everything from one ``np.random.Generator``, so a clip is a pure
function of the generator's seed:

* **World.** A large canvas (the frame plus a margin that covers the whole clip's camera path) holding a colour
  gradient, smooth multi-scale colour noise, patches of oriented sinusoidal gratings (periods 10-32 px), filled
  polygons / ellipses / rotated rectangles with anti-aliased sharp edges, thin strokes (1-3 px anti-aliased
  polylines and curves), short text, and a faint fine-grain noise on top. Sizes are in GT pixels, so the content
  has detail at the GT scale that x4 bicubic downsampling removes but a network can learn to restore (little
  content sits near the GT Nyquist limit, which LQ could not predict).
* **Global motion.** A camera that translates (up to 1.5 px/frame, constant acceleration), zooms (<= 0.4 %/frame)
  and rotates (<= 0.25 deg/frame), rendered by one ``cv2.warpAffine`` (bicubic, sub-pixel) of the canvas per frame.
* **Local motion.** One to three objects (disc, ellipse or polygon with its own texture and an anti-aliased
  alpha mask) moving at up to 2.5 px/frame and rotating at up to 2 deg/frame, composited (premultiplied alpha)
  after their own sub-pixel ``warpAffine``.

Time is continuous, so a frame can be rendered at any ``t``: motion blur is the average of ``n`` renders spread
over the exposure. Rendered frames are clipped to [0, 1] and quantised to 8-bit levels (like PNG frames).

Degradations (all items are deterministic functions of ``(seed, index)``, augmentation and noise included):

* ``sr``: ``L = quantise(clip(F.interpolate(H, 1/scale, mode='bicubic', antialias=True)))`` (PyTorch's
  antialiased bicubic, a = -0.5, the same kernel as MATLAB ``imresize``; close to, not bit-equal with, the BI
  degradation of REDS/Vimeo). See :func:`bicubic_downsample`.
* ``deblur``: the camera and objects move 3x faster; ``L`` frame ``t`` is the mean of ``n`` renders over
  ``[t - 0.5, t + 0.5]`` (``n`` in [3, 11], chosen so consecutive renders are at most ~1.25 px apart), ``H`` the
  sharp render at ``t`` (the exposure's centre, as in GoPro/DVD).
* ``denoise``: one ``sigma ~ U[sigma_min, sigma_max] / 255`` per clip, ``L = cat(H + sigma * N(0, 1), sigma map)``,
  not clipped, ``(T, 4, h, w)`` (REFERENCE 3.4).
* ``vfi``: seven frames are rendered; ``L`` = frames 0, 2, 4, 6 and ``H`` = frame 3 (REFERENCE 3.6).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from data.dataset_options import AUGMENT, NOISE_RANGE, RGB_CHANNELS, at_least, resolve_options
from data.degradation_pipeline import DEGRADATION_OPTIONS, build_degradation
from utils.utils_option_schema import NUM, OPT_INT, Opt

logger = logging.getLogger(__name__)

TASKS = ("sr", "deblur", "denoise", "vfi")
VFI_FRAMES = 7  # rendered frames per VFI sample: inputs 0, 2, 4, 6 and target 3
_SHIFT = 4  # fixed-point bits for sub-pixel cv2 drawing
_FONTS = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX, cv2.FONT_HERSHEY_TRIPLEX)
_LETTERS = np.array(list("ABCDEFGHJKLMNPRSTUVWXYZabdeghkmnqrstuvwxyz0123456789"))


# Drawing primitives
def _fixed(points: np.ndarray) -> np.ndarray:
    return np.round(points * (1 << _SHIFT)).astype(np.int32)


def _smooth_noise(rng: np.random.Generator, h: int, w: int, cell: int, channels: int = 3) -> np.ndarray:
    """Value noise in [0, 1]: uniform noise on a grid of ``cell`` px, bicubically upsampled. (h, w, channels)."""
    lh, lw = h // cell + 4, w // cell + 4
    up = cv2.resize(rng.random((lh, lw, channels), dtype=np.float32), (lw * cell, lh * cell),
                    interpolation=cv2.INTER_CUBIC).reshape(lh * cell, lw * cell, channels)
    oy, ox = rng.integers(cell, 2 * cell, size=2)
    return up[oy:oy + h, ox:ox + w]


def _blend(img: np.ndarray, bbox: tuple[float, float, float, float], color: np.ndarray, draw: Any) -> None:
    """Draw a 255-valued anti-aliased mask inside ``bbox`` (x0, y0, x1, y1) and alpha-blend ``color`` with it."""
    h, w = img.shape[:2]
    x0, y0 = max(int(bbox[0]) - 2, 0), max(int(bbox[1]) - 2, 0)
    x1, y1 = min(int(math.ceil(bbox[2])) + 3, w), min(int(math.ceil(bbox[3])) + 3, h)
    if x1 <= x0 or y1 <= y0:
        return
    mask = np.zeros((y1 - y0, x1 - x0), np.uint8)
    draw(mask, np.array([x0, y0], np.float64))
    alpha = mask.astype(np.float32)[..., None] * (1.0 / 255.0)
    roi = img[y0:y1, x0:x1]
    roi += alpha * (color.astype(np.float32) - roi)


def _random_polygon(rng: np.random.Generator, center: np.ndarray, radius: float) -> np.ndarray:
    kind = rng.integers(3)
    if kind == 0:  # rotated rectangle
        a, asp = rng.uniform(0, np.pi), rng.uniform(0.3, 1.0)
        hw, hh = radius * np.cos(np.arctan(asp)), radius * np.sin(np.arctan(asp))
        corners = np.array([[-hw, -hh], [hw, -hh], [hw, hh], [-hw, hh]])
        rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        return center + corners @ rot.T
    k = int(rng.integers(3, 7))
    angles = np.sort(rng.uniform(0, 2 * np.pi, k))
    radii = radius * rng.uniform(0.5, 1.0, k) if kind == 1 else np.full(k, radius)
    return center + np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)


def _draw_shapes(rng: np.random.Generator, img: np.ndarray, count: int, rmin: float, rmax: float) -> None:
    h, w = img.shape[:2]
    for _ in range(count):
        center, radius = rng.uniform([0, 0], [w, h]), rng.uniform(rmin, rmax)
        color = rng.random(3)
        box = (center[0] - radius, center[1] - radius, center[0] + radius, center[1] + radius)
        if rng.random() < 0.35:
            axes, angle = radius * np.array([1.0, rng.uniform(0.3, 1.0)]), rng.uniform(0, 180)
            _blend(img, box, color, lambda m, o, c=center, a=axes, r=angle: cv2.ellipse(
                m, tuple(_fixed(c - o)), tuple(_fixed(a)), r, 0, 360, 255, -1, cv2.LINE_AA, _SHIFT))
        else:
            pts = _random_polygon(rng, center, radius)
            _blend(img, box, color, lambda m, o, p=pts: cv2.fillPoly(m, [_fixed(p - o)], 255, cv2.LINE_AA, _SHIFT))


def _draw_strokes(rng: np.random.Generator, img: np.ndarray, count: int, length: float) -> None:
    h, w = img.shape[:2]
    for _ in range(count):
        p0 = rng.uniform([0, 0], [w, h])
        p1, p2 = p0 + rng.uniform(-length, length, 2), p0 + rng.uniform(-length, length, 2)
        s = np.linspace(0, 1, 12)[:, None] if rng.random() < 0.5 else np.array([[0.0], [1.0]])
        pts = (1 - s) ** 2 * p0 + 2 * s * (1 - s) * p1 + s**2 * p2 if len(s) > 2 else np.stack([p0, p2])
        thick = int(rng.integers(1, 4))
        box = (*(pts.min(0) - thick), *(pts.max(0) + thick))
        _blend(img, box, rng.random(3), lambda m, o, p=pts, t=thick: cv2.polylines(
            m, [_fixed(p - o)], False, 255, t, cv2.LINE_AA, _SHIFT))


def _draw_text(rng: np.random.Generator, img: np.ndarray, count: int) -> None:
    h, w = img.shape[:2]
    for _ in range(count):
        text = "".join(rng.choice(_LETTERS, int(rng.integers(2, 8))))
        font, scale, thick = _FONTS[rng.integers(len(_FONTS))], rng.uniform(0.35, 1.2), int(rng.integers(1, 3))
        (tw, th), base = cv2.getTextSize(text, font, scale, thick)
        x, y = int(rng.integers(-tw // 2, w)), int(rng.integers(0, h + th))
        _blend(img, (x, y - th, x + tw, y + base), rng.random(3), lambda m, o, t=text, f=font, s=scale, k=thick, x=x,
               y=y: cv2.putText(m, t, (x - int(o[0]), y - int(o[1])), f, s, 255, k, cv2.LINE_AA))


def make_texture(rng: np.random.Generator, h: int, w: int, detail: float = 1.0) -> np.ndarray:
    """A textured still image: gradient, smooth noise, gratings, shapes, strokes, text. (h, w, 3) float32."""
    x, y = np.arange(w, dtype=np.float32)[None, :], np.arange(h, dtype=np.float32)[:, None]
    theta = rng.uniform(0, 2 * np.pi)
    g = x * np.float32(np.cos(theta)) + y * np.float32(np.sin(theta))
    g = (g - g.min()) / max(float(g.max() - g.min()), 1e-6)
    c0, c1 = rng.random(3, dtype=np.float32), rng.random(3, dtype=np.float32)
    img = c0 + (c1 - c0) * g[..., None]
    img += np.float32(rng.uniform(0.05, 0.3)) * (_smooth_noise(rng, h, w, int(rng.integers(24, 64))) - 0.5)
    if rng.random() < 0.6:
        period, phase, th = rng.uniform(10, 32), rng.uniform(0, 2 * np.pi), rng.uniform(0, np.pi)
        arg = (x * np.float32(np.cos(th)) + y * np.float32(np.sin(th))) * np.float32(2 * np.pi / period) + phase
        patch = np.clip((_smooth_noise(rng, h, w, int(rng.integers(32, 80)), 1) - 0.5) * 6 + 0.5, 0, 1)
        img += np.sin(arg)[..., None] * patch * (rng.random(3, dtype=np.float32) - 0.5) * np.float32(0.5)
    area, side = h * w / 256.0**2, min(h, w)
    _draw_shapes(rng, img, max(1, round(detail * area * rng.uniform(4, 10))), 0.03 * side, 0.2 * side)
    _draw_strokes(rng, img, max(1, round(detail * area * rng.uniform(4, 12))), 0.25 * side)
    _draw_text(rng, img, int(rng.binomial(max(1, round(detail * area * 4)), 0.5)))
    img += np.float32(rng.uniform(0.0, 0.03)) * (_smooth_noise(rng, h, w, int(rng.integers(4, 8))) - 0.5)
    return img


# Scene: canvas + camera + moving objects, rendered at any time t
def _rotation(angle: float, zoom: float = 1.0) -> np.ndarray:
    c, s = math.cos(angle) * zoom, math.sin(angle) * zoom
    return np.array([[c, -s], [s, c]])


class SyntheticScene:
    """A procedural world seen by a moving camera, with moving objects.

    Args:
        rng: the only source of randomness.
        height: frame height (GT pixels).
        width: frame width (GT pixels).
        num_frames: frames ``0 .. num_frames - 1`` will be rendered (sizes the canvas margin).
        motion_scale: multiplies every velocity (global and local).
    """

    def __init__(self, rng: np.random.Generator, height: int, width: int, num_frames: int,
                 motion_scale: float = 1.0) -> None:
        if height < 4 or width < 4 or num_frames < 1:
            raise ValueError(f"SyntheticScene: frames must be at least 4x4 and num_frames >= 1, got "
                             f"{height}x{width}, num_frames={num_frames}")
        self.h, self.w, self.t_center = height, width, (num_frames - 1) / 2
        direction = rng.uniform(0, 2 * np.pi)
        self.velocity = rng.uniform(0, 1.5) * motion_scale * np.array([np.cos(direction), np.sin(direction)])
        self.accel = rng.normal(0, 0.05, 2) * motion_scale
        self.rot_rate = np.deg2rad(rng.uniform(-0.25, 0.25)) * motion_scale
        self.zoom_rate = rng.uniform(-0.004, 0.004) * motion_scale
        span = num_frames / 2 + 0.5  # |t - t_center| over the clip, exposure included
        reach = np.abs(self.velocity).max() * span + 0.5 * np.abs(self.accel).max() * span**2
        reach += 0.5 * math.hypot(height, width) * (abs(self.rot_rate) + 1.1 * abs(self.zoom_rate)) * span
        margin = int(math.ceil(reach)) + 4
        self.canvas = make_texture(rng, height + 2 * margin, width + 2 * margin)
        self.objects = [self._make_object(rng, motion_scale) for _ in range(int(rng.integers(1, 4)))]

    def _make_object(self, rng: np.random.Generator, motion_scale: float) -> dict[str, Any]:
        side = min(self.h, self.w)
        d = max(8, int(side * rng.uniform(0.12, 0.35)))
        tex = make_texture(rng, d, d, detail=0.5)
        mask = np.zeros((d, d), np.uint8)
        c, r = np.array([(d - 1) / 2, (d - 1) / 2]), (d - 2) / 2
        if rng.random() < 0.5:
            axes = tuple(_fixed(np.array([r, r * rng.uniform(0.5, 1.0)])))
            cv2.ellipse(mask, tuple(_fixed(c)), axes, 0, 0, 360, 255, -1, cv2.LINE_AA, _SHIFT)
        else:
            cv2.fillPoly(mask, [_fixed(_random_polygon(rng, c, r))], 255, cv2.LINE_AA, _SHIFT)
        alpha = mask.astype(np.float32)[..., None] / 255.0
        direction, speed = rng.uniform(0, 2 * np.pi), rng.uniform(0.3, 2.5) * motion_scale
        return {"sprite": np.concatenate([tex * alpha, alpha], axis=2),
                "pos": rng.uniform([0, 0], [self.w, self.h]),
                "vel": speed * np.array([np.cos(direction), np.sin(direction)]),
                "angle": rng.uniform(0, 2 * np.pi), "spin": np.deg2rad(rng.uniform(-2, 2)) * motion_scale}

    def max_speed(self) -> float:
        """Upper bound of any pixel's speed (px/frame), used to pick the number of motion-blur sub-frames."""
        half_diag = 0.5 * math.hypot(self.h, self.w)
        cam = np.abs(self.velocity).sum() + np.abs(self.accel).sum() * (self.t_center + 1)
        cam += half_diag * (abs(self.rot_rate) + abs(self.zoom_rate))
        objs = [np.abs(o["vel"]).sum() + abs(o["spin"]) * o["sprite"].shape[0] / 2 for o in self.objects]
        return float(cam + max(objs, default=0.0))

    def render(self, t: float) -> np.ndarray:
        """The frame at time ``t`` (frame units). Returns (H, W, 3) float32 in [0, 1] (not quantised)."""
        dt = t - self.t_center
        a = _rotation(self.rot_rate * dt, math.exp(self.zoom_rate * dt))
        hc, wc = self.canvas.shape[:2]
        shift = np.array([(wc - 1) / 2, (hc - 1) / 2]) + self.velocity * dt + 0.5 * self.accel * dt**2
        b = shift - a @ np.array([(self.w - 1) / 2, (self.h - 1) / 2])
        frame = cv2.warpAffine(self.canvas, np.hstack([a, b[:, None]]), (self.w, self.h),
                               flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REFLECT101)
        for obj in self.objects:
            self._paste(frame, obj["sprite"], obj["pos"] + obj["vel"] * dt, obj["angle"] + obj["spin"] * dt)
        return np.clip(frame, 0.0, 1.0, out=frame)

    def _paste(self, frame: np.ndarray, sprite: np.ndarray, center: np.ndarray, angle: float) -> None:
        d = sprite.shape[0]
        size = d + 3
        ix, iy = int(math.floor(center[0] - size / 2)), int(math.floor(center[1] - size / 2))
        a = _rotation(-angle)
        b = np.array([(d - 1) / 2, (d - 1) / 2]) - a @ (center - np.array([ix, iy]))
        patch = cv2.warpAffine(sprite, np.hstack([a, b[:, None]]), (size, size),
                               flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_CONSTANT)
        x0, y0, x1, y1 = max(ix, 0), max(iy, 0), min(ix + size, self.w), min(iy + size, self.h)
        if x1 <= x0 or y1 <= y0:
            return
        patch = patch[y0 - iy:y1 - iy, x0 - ix:x1 - ix]
        roi = frame[y0:y1, x0:x1]
        roi *= 1.0 - np.clip(patch[..., 3:], 0.0, 1.0)
        roi += patch[..., :3]

    def render_motion_blur(self, t: float, exposure: float = 1.0, max_step: float = 1.25) -> np.ndarray:
        """Mean of renders over ``[t - exposure/2, t + exposure/2]``, at most ``max_step`` px apart. (H, W, 3)."""
        n = min(max(3, int(math.ceil(self.max_speed() * exposure / max_step)) + 1), 11)
        acc = np.zeros((self.h, self.w, 3), np.float32)
        for k in range(n):
            acc += self.render(t + exposure * ((k + 0.5) / n - 0.5))
        return acc / n


def quantize(frames: np.ndarray) -> np.ndarray:
    """Clip to [0, 1] and round to 8-bit levels (as a PNG round trip would). Same shape, float32."""
    return (np.round(np.clip(frames, 0.0, 1.0) * 255.0) / 255.0).astype(np.float32)


def render_clip(rng: np.random.Generator, num_frames: int, height: int, width: int,
                motion_scale: float = 1.0) -> np.ndarray:
    """Render a procedural clip (frames at t = 0 .. num_frames - 1).

    Returns:
        (T, H, W, 3) float32 in [0, 1], quantised to 8-bit levels.
    """
    scene = SyntheticScene(rng, height, width, num_frames, motion_scale)
    return quantize(np.stack([scene.render(t) for t in range(num_frames)]))


def render_blurry_clip(rng: np.random.Generator, num_frames: int, height: int, width: int,
                       motion_scale: float = 3.0, exposure: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Render a clip and its motion-blurred version (mean of sub-frame renders over the exposure).

    Returns:
        ``(sharp, blurry)``, each (T, H, W, 3) float32 in [0, 1], quantised to 8-bit levels.
    """
    scene = SyntheticScene(rng, height, width, num_frames, motion_scale)
    sharp = np.stack([scene.render(t) for t in range(num_frames)])
    blurry = np.stack([scene.render_motion_blur(t, exposure) for t in range(num_frames)])
    return quantize(sharp), quantize(blurry)


def bicubic_downsample(frames: torch.Tensor, scale: int) -> torch.Tensor:
    """x``scale`` antialiased bicubic downsampling, clipped and quantised to 8-bit levels.

    Args:
        frames: (T, C, H, W) float32 in [0, 1], H and W divisible by ``scale``.
        scale: integer factor.

    Returns:
        (T, C, H // scale, W // scale) float32 in [0, 1].
    """
    if scale == 1:
        return frames.clone()
    h, w = frames.shape[-2:]
    out = F.interpolate(frames, size=(h // scale, w // scale), mode="bicubic", antialias=True, align_corners=False)
    return torch.round(out.clamp(0, 1) * 255.0) / 255.0


# Datasets
def _to_tensor(frames: np.ndarray) -> torch.Tensor:
    """(T, H, W, C) numpy -> (T, C, H, W) contiguous float32 tensor."""
    return torch.from_numpy(np.ascontiguousarray(frames.transpose(0, 3, 1, 2), dtype=np.float32))


def _refuse_lq_size(value: Any) -> str | None:
    sizes = [value, value] if isinstance(value, int) else value
    ok = len(sizes) == 2 and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes)
    return None if ok else "expected [h, w] (or one integer) of positive sizes"


# keys of both synthetic sets (each default written once)
_SYNTHETIC_OPTIONS: dict[str, Opt] = {
    "n_channels": RGB_CHANNELS,
    "task": Opt(str, "sr", "Degradation: `sr` (x`scale` antialiased bicubic), `deblur` (motion blur over the "
                "exposure), `denoise` (Gaussian noise plus the sigma map) or `vfi` (frames 0, 2, 4, 6 -> frame 3).",
                choices=TASKS),
    "scale": Opt(OPT_INT, None, "Upscaling factor, only `sr` takes more than 1 (default: the top-level `scale`; "
                 "null: 4 for `sr`, 1 otherwise).", refuse=at_least(1)),
    "num_frame": Opt(int, 6, "Frames per clip (`vfi` always renders 7 and takes 4 inputs).", refuse=at_least(1)),
}


def _task_and_scale(opt: dict[str, Any], cls: str) -> tuple[str, int]:
    task, scale = opt["task"], opt["scale"]
    if scale is None:  # built directly: the scale the task implies
        scale = 4 if task == "sr" else 1
    if task != "sr" and scale != 1:
        raise ValueError(f"{cls}: option 'scale' = {scale} is invalid for task '{task}'; only 'sr' takes scale > 1")
    return task, scale


def _make_item(rng: np.random.Generator, task: str, num_frame: int, h: int, w: int, scale: int, sigma_range:
               tuple[float, float], augment: tuple[bool, bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """Render one sample and degrade it. Returns ``(L, H)`` as in the module docstring."""
    if task == "deblur":
        stack = np.concatenate(render_blurry_clip(rng, num_frame, h, w))  # sharp then blurry, (2T, H, W, 3)
    else:
        stack = render_clip(rng, VFI_FRAMES if task == "vfi" else num_frame, h, w)
    use_hflip, use_rot = augment
    if use_hflip and rng.random() < 0.5:
        stack = stack[:, :, ::-1]
    if use_rot and rng.random() < 0.5:
        stack = stack[:, ::-1]
    if use_rot and rng.random() < 0.5:
        stack = stack.transpose(0, 2, 1, 3)
    frames = _to_tensor(stack)
    if task == "sr":
        return bicubic_downsample(frames, scale), frames
    if task == "deblur":
        return frames[num_frame:], frames[:num_frame]
    if task == "vfi":
        return frames[0::2], frames[VFI_FRAMES // 2:VFI_FRAMES // 2 + 1]
    sigma = rng.uniform(*sigma_range) / 255.0
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    noise = torch.randn(frames.shape, generator=gen) * np.float32(sigma)
    sigma_map = torch.full_like(frames[:, :1], np.float32(sigma))
    return torch.cat([frames + noise, sigma_map], dim=1), frames


class _SeededClips(Dataset):
    """``num_clips`` items, item ``i`` drawn from a generator seeded by ``(seed, i)`` alone."""

    num_clips: int
    seed: int

    def __len__(self) -> int:
        return self.num_clips

    def _rng(self, index: int) -> np.random.Generator:
        if not 0 <= index < self.num_clips:
            raise IndexError(f"{type(self).__name__}: index {index} out of range [0, {self.num_clips})")
        return np.random.Generator(np.random.PCG64([self.seed, index]))


class SyntheticVideoTrainDataset(_SeededClips):
    """Training clips rendered on the fly; item ``i`` is a deterministic function of ``(seed, i)``.

    Options: the keys of :attr:`OPTIONS` (plus the common dataset keys); ``opt`` is read, never modified.
    Augmentation (``use_hflip`` / ``use_rot``) is shared by all frames, as in the real training sets.

    Items: ``{'L': (T, C, gt_size // scale, gt_size // scale), 'H': (T', 3, gt_size, gt_size), 'key': str}``,
    float32 in [0, 1] (denoising ``L`` is unclipped, C = 4; 'vfi': ``L`` (4, 3, ...), ``H`` (1, 3, ...)).
    """

    OPTIONS: dict[str, Opt] = {
        **_SYNTHETIC_OPTIONS,
        "gt_size": Opt(int, 256, "Side of the square GT clip in pixels (divisible by `scale`, at least 4 x scale).",
                       refuse=at_least(4)),
        "num_clips": Opt(int, 1000, "Dataset length: item i is rendered from (seed, i).", refuse=at_least(1)),
        "seed": Opt(int, 0, "Seed of the clips (and of their augmentation and noise).", refuse=at_least(0)),
        **NOISE_RANGE,
        **AUGMENT,
    }

    def __init__(self, opt: dict[str, Any]) -> None:
        cls = type(self).__name__
        self.opt = opt = resolve_options(type(self), opt)
        self.task, self.scale = _task_and_scale(opt, cls)
        self.num_frame = opt["num_frame"]
        self.gt_size = opt["gt_size"]
        if self.gt_size % self.scale or self.gt_size < 4 * self.scale:
            raise ValueError(f"{cls}: option 'gt_size' = {self.gt_size} must be a multiple of scale {self.scale} "
                             f"and at least {4 * self.scale}")
        self.num_clips = opt["num_clips"]
        self.seed = opt["seed"]
        self.sigma_range = (float(opt["sigma_min"]), float(opt["sigma_max"]))
        if self.sigma_range[0] > self.sigma_range[1]:
            raise ValueError(f"{cls}: 'sigma_min' = {self.sigma_range[0]} exceeds 'sigma_max' = {self.sigma_range[1]}")
        self.augment = (opt["use_hflip"], opt["use_rot"])
        if self.task == "vfi" and opt["num_frame"] != VFI_FRAMES:
            logger.info("%s: task 'vfi' renders %d frames; 'num_frame' = %s is ignored", cls, VFI_FRAMES,
                        opt["num_frame"])

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = self._rng(index)
        lq, gt = _make_item(rng, self.task, self.num_frame, self.gt_size, self.gt_size, self.scale,
                            self.sigma_range, self.augment)
        return {"L": lq, "H": gt, "key": f"clip_{index:06d}/{0:08d}"}


class SyntheticVideoTestDataset(_SeededClips):
    """Whole validation clips rendered on the fly (no crop, no augmentation), deterministic by ``(seed, index)``.

    Options: the keys of :attr:`OPTIONS` (plus the common dataset keys); ``opt`` is read, never modified.

    Items: ``{'L': (T, C, h, w), 'H': (T, 3, h * scale, w * scale) ('vfi': (1, 3, h, w)), 'folder': 'clip_000',
    'lq_path': [...], 'gt_path': [...]}`` with pseudo frame names ``'clip_000/00000000.png'`` (for 'vfi' both lists
    hold the one interpolated frame, ``'clip_000/00000003.png'``).
    """

    OPTIONS: dict[str, Opt] = {
        **_SYNTHETIC_OPTIONS,
        "num_clips": Opt(int, 2, "Number of validation clips: clip i is rendered from (seed, i).", refuse=at_least(1)),
        "seed": Opt(int, 1234, "Seed of the clips (and of their noise).", refuse=at_least(0)),
        "lq_size": Opt((list, int), [64, 64], "[h, w] of the LQ frames (one integer: square); GT is `scale` times "
                       "larger.", refuse=_refuse_lq_size),
        "sigma": Opt(NUM, 30, "Noise std of `denoise` on the [0, 255] scale (one fixed level for every clip).",
                     refuse=at_least(0)),
        # validating a real-world model on the degradations it was trained for (`sr` only; each clip's draw from
        # (seed, index), so every validation sees the same LQ)
        **DEGRADATION_OPTIONS,
    }

    def __init__(self, opt: dict[str, Any]) -> None:
        cls = type(self).__name__
        self.opt = opt = resolve_options(type(self), opt)
        self.task, self.scale = _task_and_scale(opt, cls)
        self.degradation = None
        if opt["degradations"] is not None:
            if self.task != "sr":
                raise ValueError(f"{cls}: option 'degradations' takes task 'sr' (the LQ is the degraded GT), "
                                 f"not {self.task!r}")
            self.degradation = build_degradation(opt["degradations"], self.scale)
        self.num_clips = opt["num_clips"]
        self.num_frame = opt["num_frame"]
        self.seed = opt["seed"]
        self.sigma = float(opt["sigma"])
        lq_size = opt["lq_size"]
        lq_size = [lq_size, lq_size] if isinstance(lq_size, int) else lq_size
        if any(s * self.scale < 4 for s in lq_size):
            raise ValueError(f"{cls}: option 'lq_size' = {opt['lq_size']!r} is too small; need h * scale and "
                             "w * scale >= 4")
        self.lq_size = (int(lq_size[0]), int(lq_size[1]))

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = self._rng(index)
        h, w = self.lq_size[0] * self.scale, self.lq_size[1] * self.scale
        lq, gt = _make_item(rng, self.task, self.num_frame, h, w, self.scale, (self.sigma, self.sigma),
                            (False, False))
        if self.degradation is not None:
            clip = gt.permute(0, 2, 3, 1).numpy()
            lq = _to_tensor(self.degradation(clip, np.random.Generator(np.random.PCG64([self.seed, index, 1]))))
        folder = f"clip_{index:03d}"
        frame_ids = [VFI_FRAMES // 2] if self.task == "vfi" else range(gt.shape[0])
        names = [f"{folder}/{i:08d}.png" for i in frame_ids]
        return {"L": lq, "H": gt, "folder": folder, "lq_path": list(names), "gt_path": list(names)}
