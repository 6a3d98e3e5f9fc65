"""The evaluation report: one self-contained HTML page (``main_test_vrt.py --report`` -> ``<save_dir>/report.html``).

Written from the records that ``metrics.csv`` and ``clips.csv`` are written from: a table of every clip's value of
every computed metric (and the mean over clips), a per-frame curve of each metric over each clip (inline SVG: a
flickering frame or a tile seam shows up as a spike), and for each clip a before/after comparison of one frame
(the input upscaled | the output | the ground truth when there is one) with a slider and buttons. Images are
embedded as base64 PNG; nothing is loaded from the network (no CDN, no fonts, no scripts from elsewhere), so the file
can be mailed or archived alone. The page is written to a temporary name and renamed.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from utils.metrics import MetricSpec
from utils.utils_fs import atomic_open

PANELS = ("input", "output", "gt")
PANEL_TITLES = {"input": "input (upscaled)", "output": "output", "gt": "ground truth"}
MAX_SIDE = 1280  # comparison panels larger than this are downscaled (area) to keep the page small
MIN_SHOWN = 480  # narrower comparison frames are shown enlarged by a whole factor (nearest neighbour)


@dataclass
class ClipReport:
    """One clip as the report shows it.

    Attributes:
        folder: the clip's name.
        names: output frame names, in order.
        frames: per output frame, ``{metric: value}`` (a metric without a value at a frame is absent).
        values: the clip's value of each metric (``clips.csv``).
        images: PNG bytes of the compared frame: ``'input'``, ``'output'`` and, with ground truth, ``'gt'``.
        frame: the name of the compared frame.
    """

    folder: str
    names: list[str]
    frames: list[dict[str, float]]
    values: dict[str, float]
    images: dict[str, bytes] = field(default_factory=dict)
    frame: str = ""


def comparison_panels(lq: torch.Tensor, out: torch.Tensor, gt: torch.Tensor | None) -> dict[str, np.ndarray]:
    """The compared frame's panels as (H, W, 3) uint8 RGB: the input frame bicubic-upscaled to the output's size
    (the input baseline), the output and the ground truth.

    Args:
        lq: ``(C, h, w)`` in [0, 1] (channels beyond RGB, e.g. a noise-level map, are dropped).
        out: ``(3, H, W)`` in [0, 1].
        gt: ``(3, H, W)`` or ``None``.
    """
    lq_rgb = lq[:3].float()[None]
    if lq_rgb.shape[-2:] != out.shape[-2:]:
        lq_rgb = F.interpolate(lq_rgb, size=out.shape[-2:], mode="bicubic", align_corners=False)
    panels = {"input": lq_rgb[0], "output": out}
    if gt is not None:
        panels["gt"] = gt
    return {k: _uint8(v) for k, v in panels.items()}


def _uint8(img: torch.Tensor) -> np.ndarray:
    arr = img.detach().float().cpu().clamp(0, 1).mul(255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return np.ascontiguousarray(arr)


def encode_png(rgb: np.ndarray, max_side: int = MAX_SIDE) -> bytes:
    """(H, W, 3) uint8 RGB as PNG bytes, downscaled (area) when its long side exceeds ``max_side``."""
    h, w = rgb.shape[:2]
    if max(h, w) > max_side:
        f = max_side / max(h, w)
        rgb = cv2.resize(rgb, (max(1, round(w * f)), max(1, round(h * f))), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(rgb[..., ::-1]))
    if not ok:
        raise OSError("PNG encoding failed")
    return buf.tobytes()


# ----------------------------------------------------------------------------------------------------- plots
def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def frame_plot(values: Sequence[float | None], names: Sequence[str], spec: MetricSpec, mark: int | None = None,
               width: int = 560, height: int = 130) -> str:
    """An inline SVG line chart of one metric over a clip's frames (gaps where a frame has no value; +inf, e.g.
    PSNR of identical frames, is drawn at the top edge and listed in the point's tooltip)."""
    pad_l, pad_r, pad_t, pad_b = 58, 10, 10, 22
    finite = [v for v in values if _finite(v)]
    n = len(values)
    svg = [f'<svg class="plot" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="{html.escape(spec.label)} per frame">']
    svg.append(f'<rect x="{pad_l}" y="{pad_t}" width="{width - pad_l - pad_r}" height="{height - pad_t - pad_b}" '
               'class="area"/>')
    if not finite:
        svg.append(f'<text x="{width / 2}" y="{height / 2}" class="axis" text-anchor="middle">no per-frame values'
                   '</text></svg>')
        return "".join(svg)
    lo, hi = min(finite), max(finite)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5 * (abs(lo) or 1) * 0.01, hi + 0.5 * (abs(hi) or 1) * 0.01
    span = hi - lo

    def x(i: int) -> float:
        return pad_l + (width - pad_l - pad_r) * (i / max(n - 1, 1))

    def y(v: float) -> float:
        if not _finite(v):
            return pad_t
        return pad_t + (height - pad_t - pad_b) * (1 - (v - lo) / span)

    for v, anchor in ((hi, pad_t + 4), (lo, height - pad_b)):
        svg.append(f'<text x="{pad_l - 4}" y="{anchor}" class="axis" text-anchor="end">'
                   f'{html.escape(format(v, spec.fmt))}</text>')
    svg.append(f'<text x="{pad_l}" y="{height - 6}" class="axis">{html.escape(names[0]) if names else 0}</text>')
    if n > 1:
        svg.append(f'<text x="{width - pad_r}" y="{height - 6}" class="axis" text-anchor="end">'
                   f'{html.escape(names[-1])}</text>')
    if mark is not None and 0 <= mark < n:
        svg.append(f'<line x1="{x(mark):.1f}" x2="{x(mark):.1f}" y1="{pad_t}" y2="{height - pad_b}" class="mark"/>')
    runs: list[list[str]] = [[]]
    for i, v in enumerate(values):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            runs.append([])
        else:
            runs[-1].append(f"{x(i):.1f},{y(v):.1f}")
    for run in runs:
        if len(run) > 1:
            svg.append(f'<polyline points="{" ".join(run)}" class="line"/>')
        elif run:
            px, py = run[0].split(",")
            svg.append(f'<circle cx="{px}" cy="{py}" r="2" class="dot"/>')
    if n <= 400:  # a tooltip per frame, where there are few enough to hover
        for i, v in enumerate(values):
            if v is not None and not (isinstance(v, float) and math.isnan(v)):
                svg.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="4" class="hover"><title>'
                           f'{html.escape(names[i] if i < len(names) else str(i))}: '
                           f'{html.escape(spec.format(v) if _finite(v) else str(v))}</title></circle>')
    svg.append("</svg>")
    return "".join(svg)


# ------------------------------------------------------------------------------------------------------ page
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:20px}
header p{margin:0;color:#c9cfdb}main{padding:18px 28px;max-width:1400px}
table{border-collapse:collapse;background:#fff;margin:8px 0 24px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
th,td{padding:6px 12px;border-bottom:1px solid #e3e6ec;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}th{background:#eef1f6;font-weight:600}
tr.mean td{font-weight:600;background:#f3f6fb}td.best{color:#0a7c3e;font-weight:600}
section.clip{background:#fff;margin:0 0 24px;padding:14px 18px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
section.clip h2{margin:0 0 10px;font-size:17px}.plots{display:flex;flex-wrap:wrap;gap:10px 22px}
.plots figure{margin:0}.plots figcaption{font-weight:600;font-size:13px}
svg .area{fill:#fafbfd;stroke:#d5dae3}svg .line{fill:none;stroke:#2f6fd6;stroke-width:1.6}
svg .dot{fill:#2f6fd6}svg .hover{fill:transparent}svg .hover:hover{fill:#d63f2f}
svg .mark{stroke:#d63f2f;stroke-dasharray:3 3}svg .axis{font-size:11px;fill:#5b6475}
.compare{margin-top:14px}.stage{position:relative;display:inline-block;max-width:100%;line-height:0;
background:#000;user-select:none}.stage img{display:none;max-width:100%;height:auto;image-rendering:pixelated}
.stage img.base{display:block}.stage img.top{display:block;position:absolute;left:0;top:0}
.stage .knob{position:absolute;top:0;bottom:0;width:2px;
background:#fff;box-shadow:0 0 3px #000;pointer-events:none}
.controls{margin:8px 0;display:flex;gap:8px;align-items:center;flex-wrap:wrap}
.controls button{border:1px solid #b9c1cf;background:#fff;border-radius:4px;padding:3px 10px;cursor:pointer}
.controls button.on{background:#2f6fd6;color:#fff;border-color:#2f6fd6}.controls input{width:260px}
.note{color:#5b6475;font-size:12px}
"""

# the before/after widget: the right-hand image is clipped at the slider; the buttons choose the two images
_JS = """
document.querySelectorAll('.compare').forEach(function (box) {
  var pick = {left: box.getAttribute('data-left'), right: box.getAttribute('data-right')};
  var knob = box.querySelector('.knob'), slider = box.querySelector('input[type=range]');
  function show() {
    var p = slider.value;
    box.querySelectorAll('.stage img').forEach(function (img) {
      var panel = img.getAttribute('data-panel');
      img.className = panel === pick.left ? 'base' : (panel === pick.right ? 'top' : '');
      img.style.clipPath = img.className === 'top' ? 'inset(0 0 0 ' + p + '%)' : '';
    });
    knob.style.left = p + '%';
    knob.style.display = pick.left === pick.right ? 'none' : '';
    box.setAttribute('data-shown', pick.left + '|' + pick.right);
    box.querySelectorAll('button').forEach(function (b) {
      b.classList.toggle('on', pick[b.getAttribute('data-side')] === b.getAttribute('data-panel'));
    });
  }
  box.querySelectorAll('button').forEach(function (b) {
    b.addEventListener('click', function () {
      pick[b.getAttribute('data-side')] = b.getAttribute('data-panel');
      show();
    });
  });
  slider.addEventListener('input', show);
  show();
});
document.body.setAttribute('data-ready', '1');  // the script ran to its end (tests/test_report.py reads it)
"""


def _cell(value: float | None, spec: MetricSpec) -> str:
    if value is None:
        return "&ndash;"
    return html.escape(spec.format(value) if _finite(value) else str(value))


def _table(specs: Sequence[MetricSpec], clips: Sequence[ClipReport], average: Mapping[str, float]) -> str:
    head = "".join(f'<th title="{html.escape(s.source)}">{html.escape(s.label)} '
                   f'{"&uarr;" if s.higher_is_better else "&darr;"}</th>' for s in specs)
    best: dict[str, float] = {}
    for s in specs:
        vals = [c.values[s.name] for c in clips if _finite(c.values.get(s.name))]
        if len(vals) > 1:
            best[s.name] = max(vals) if s.higher_is_better else min(vals)
    rows = []
    for c in clips:
        cells = "".join(f'<td class="{"best" if best.get(s.name) == c.values.get(s.name) else ""}">'
                        f'{_cell(c.values.get(s.name), s)}</td>' for s in specs)
        rows.append(f'<tr><td><a href="#clip-{html.escape(c.folder)}">{html.escape(c.folder)}</a></td>'
                    f"<td>{len(c.names)}</td>{cells}</tr>")
    mean = "".join(f"<td>{_cell(average.get(s.name), s)}</td>" for s in specs)
    rows.append(f'<tr class="mean"><td>mean over clips</td><td></td>{mean}</tr>')
    return f"<table><tr><th>clip</th><th>frames</th>{head}</tr>{''.join(rows)}</table>"


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _compare(clip: ClipReport) -> str:
    if not clip.images:
        return ""
    panels = [k for k in PANELS if k in clip.images]
    left, right = ("gt" if "gt" in panels else "input"), "output"
    buttons = []
    for side in ("left", "right"):
        choice = "".join(f'<button type="button" data-side="{side}" data-panel="{k}">{PANEL_TITLES[k]}</button>'
                         for k in panels)
        buttons.append(f"<span>{side}:</span>{choice}")
    width = int.from_bytes(clip.images["output"][16:20], "big")  # PNG IHDR
    zoom = max(1, math.ceil(MIN_SHOWN / max(width, 1)))  # small frames shown enlarged, pixel for pixel
    imgs = []
    for k in panels:  # each image once; the script picks the two shown (without it: left | right at 50%)
        cls = "base" if k == left else "top" if k == right else ""
        clip_style = "clip-path:inset(0 0 0 50%);" if k == right else ""
        imgs.append(f'<img class="{cls}" style="{clip_style}width:{width * zoom}px" data-panel="{k}" '
                    f'alt="{PANEL_TITLES[k]}" src="{_data_uri(clip.images[k])}">')
    return (f'<div class="compare" data-left="{left}" data-right="{right}">'
            f'<div class="controls">{" ".join(buttons)}<input type="range" min="0" max="100" value="50" '
            f'aria-label="split"></div><div class="stage">{"".join(imgs)}<div class="knob" style="left:50%">'
            f'</div></div><div class="note">frame {html.escape(clip.frame)}{f" (shown x{zoom})" if zoom > 1 else ""}: '
            "drag the slider; the buttons choose what is left and right of it</div></div>")


def _clip_section(clip: ClipReport, specs: Sequence[MetricSpec]) -> str:
    mark = clip.names.index(clip.frame) if clip.frame in clip.names else None
    figures = []
    for s in specs:
        series = [f.get(s.name) for f in clip.frames]
        if not any(v is not None for v in series):
            continue
        figures.append(f"<figure><figcaption>{html.escape(s.label)} per frame "
                       f"({'higher' if s.higher_is_better else 'lower'} is better)</figcaption>"
                       f"{frame_plot(series, clip.names, s, mark)}</figure>")
    return (f'<section class="clip" id="clip-{html.escape(clip.folder)}"><h2>{html.escape(clip.folder)}</h2>'
            f'<div class="plots">{"".join(figures)}</div>{_compare(clip)}</section>')


def render(title: str, specs: Sequence[MetricSpec], clips: Sequence[ClipReport], average: Mapping[str, float],
           about: Sequence[str] = ()) -> str:
    """The report page as one HTML string (no external resource)."""
    info = " &middot; ".join(html.escape(a) for a in about)
    body = "".join(_clip_section(c, specs) for c in clips)
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>{html.escape(title)}</h1><p>{info}</p></header><main>"
            f"<h2>Per clip</h2>{_table(specs, clips, average)}{body}</main><script>{_JS}</script></body></html>")


def write_report(path: str, title: str, specs: Sequence[MetricSpec], clips: Sequence[ClipReport],
                 average: Mapping[str, float], about: Sequence[str] = ()) -> str:
    """Write the report to ``path`` atomically (a reader sees the old file or the complete new one); returns it."""
    page = render(title, specs, clips, average, about)
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path
