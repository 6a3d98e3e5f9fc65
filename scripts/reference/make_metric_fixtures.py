"""Make the frozen reference values of the metric tests by running the reference implementations themselves, outside
the project (nothing of their code is in this repository; run this by hand, never in the test suite):

- NIQE: BasicSR's ``basicsr.metrics.niqe.calculate_niqe`` (its package ``__init__`` is skipped: only the metric and
  its helpers are imported from the checkout) on scikit-image's sample photographs and on every frame of a real H.264
  video (a camera pan over a photograph, encoded with B-frames, decoded) and of its clean source frames.
- tOF / tLP: TecoGAN's own ``metrics.py`` run as a program on PNG frames of that video (output) and its source
  (target). Its LPIPS (``LPIPSmodels``, an older copy of LPIPS v0.1) needs CUDA and IPython, so a stand-in package of
  that name answers its two calls with the ``lpips`` package's v0.1 AlexNet loaded with the tests' seeded weights
  (tests/support/metric_data.py::make_weights); everything else (the loop, Farneback's parameters, the 8x8 crop,
  the x100, the two frames cut at each end) is TecoGAN's.

Get the checkouts (anywhere outside this repository)::

    git clone https://github.com/XPixelGroup/BasicSR /tmp/ref_metrics/BasicSR
    git clone https://github.com/thunil/TecoGAN /tmp/ref_metrics/TecoGAN
    pip install lpips absl-py pandas
    python scripts/reference/make_metric_fixtures.py --basicsr /tmp/ref_metrics/BasicSR \\
        --tecogan /tmp/ref_metrics/TecoGAN

It writes tests/fixtures/metrics/pan_h264.mp4 (the video, 10 frames of 384x288) and reference_metrics.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.metric_data import PAN_VIDEO, decode_rgb, encode_h264, make_weights, pan_frames, photo  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "metrics"
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera")

# The stand-in for TecoGAN's LPIPSmodels package: its DistModel / im2tensor interface, the lpips package inside.
_STUB_UTIL = '''
import numpy as np, torch
def im2tensor(image, imtype=np.uint8, cent=1., factor=255./2.):
    return torch.Tensor((image / factor - cent)[:, :, :, np.newaxis].transpose((3, 2, 0, 1)))
'''
# metrics.py imports skimage.measure.compare_ssim (for its SSIM, not compared here), which scikit-image renamed
_STUB_SITE = '''
import skimage.measure, skimage.metrics
skimage.measure.compare_ssim = skimage.metrics.structural_similarity
'''
_STUB_DIST = '''
import os, lpips, torch
class DistModel:
    def initialize(self, model="net-lin", net="alex", use_gpu=True, version="0.1", **kw):
        assert model == "net-lin" and net == "alex" and version == "0.1"
        d = os.environ["METRIC_WEIGHTS"]
        self.net = lpips.LPIPS(net="alex", version="0.1", pretrained=True, pnet_rand=True, verbose=False,
                               model_path=os.path.join(d, "lpips_v0.1_alex.pth")).eval()
        backbone = torch.load(os.path.join(d, "alexnet-owt-7be5be79.pth"), weights_only=True)
        for name, p in self.net.named_parameters():
            if name.startswith("net."):
                _, _, idx, kind = name.split(".")
                p.data.copy_(backbone[f"features.{idx}.{kind}"])
    def forward(self, in0, in1):
        with torch.no_grad():
            return self.net(in0, in1).cpu().numpy().flatten()
'''


def basicsr_niqe(checkout: Path):
    """BasicSR's ``calculate_niqe`` without running ``basicsr/__init__.py`` (it imports every model and op)."""
    pkg = types.ModuleType("basicsr")
    pkg.__path__ = [str(checkout / "basicsr")]
    sys.modules["basicsr"] = pkg
    from basicsr.metrics.niqe import calculate_niqe

    return lambda rgb: float(calculate_niqe(rgb[..., ::-1].astype(np.float64), 0, input_order="HWC", convert_to="y"))


def tecogan_temporal(checkout: Path, out: np.ndarray, gt: np.ndarray, weights: str) -> dict:
    """Run TecoGAN's metrics.py on PNG frames; per-frame tOF and tLP keyed by frame index."""
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        stub = tmp / "stub" / "LPIPSmodels"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text("")
        (stub / "util.py").write_text(_STUB_UTIL)
        (stub / "dist_model.py").write_text(_STUB_DIST)
        (tmp / "stub" / "sitecustomize.py").write_text(_STUB_SITE)
        for name, frames in (("out", out), ("gt", gt)):
            (tmp / name).mkdir()
            for i, f in enumerate(frames):
                cv2.imwrite(str(tmp / name / f"{i:04d}.png"), f[..., ::-1])
        # a copy beside the stand-in, so that its directory (first on sys.path) is not the checkout's LPIPSmodels
        (tmp / "stub" / "metrics.py").write_bytes((checkout / "metrics.py").read_bytes())
        env = {**os.environ, "METRIC_WEIGHTS": weights, "PYTHONPATH": str(tmp / "stub")}
        run = subprocess.run([sys.executable, str(tmp / "stub" / "metrics.py"), "--output", str(tmp / "res"),
                              "--results", str(tmp / "out"), "--targets", str(tmp / "gt")],
                             cwd=tmp, env=env, capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"TecoGAN's metrics.py failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
        # metrics.csv: the per-frame table, then tables of averages appended (each starting with a header line)
        lines = (tmp / "res" / "metrics.csv").read_text().splitlines()
        end = next(i for i in range(1, len(lines) + 1) if i == len(lines) or lines[i].startswith(","))
        table = pd.read_csv(io.StringIO("\n".join(lines[:end])))
    cut = 2  # TecoGAN's cutfr: frames cut..T-cut-1 are scored, the temporal ones from cut+1
    tof = table["tOF_00"].dropna().tolist()
    tlp = table["tLP100_00" if "tLP100_00" in table else "tLP_00"].dropna().tolist()
    return {"tof": {str(cut + 1 + k): float(v) for k, v in enumerate(tof)},
            "tlp": {str(cut + 1 + k): float(v) for k, v in enumerate(tlp)}}


def git_head(checkout: Path) -> str:
    cmd = ["git", "-C", str(checkout), "rev-parse", "HEAD"]
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--basicsr", type=Path, required=True, help="a BasicSR checkout")
    parser.add_argument("--tecogan", type=Path, required=True, help="a TecoGAN checkout")
    args = parser.parse_args()

    video = FIXTURES / PAN_VIDEO
    encode_h264(pan_frames(), str(video))
    gt, out = pan_frames(), decode_rgb(str(video))
    niqe = basicsr_niqe(args.basicsr)
    with tempfile.TemporaryDirectory() as weights:
        make_weights(weights, seed=0)
        temporal = tecogan_temporal(args.tecogan, out, gt, weights)
    from importlib.metadata import version

    import torch

    record = {
        "made_by": "scripts/reference/make_metric_fixtures.py",
        "basicsr_commit": git_head(args.basicsr),
        "tecogan_commit": git_head(args.tecogan),
        "versions": {"numpy": np.__version__, "torch": torch.__version__, "lpips": version("lpips"),
                     "opencv": cv2.__version__},
        "niqe_photos": {name: niqe(photo(name)) for name in PHOTOS},
        "niqe_video_decoded": [niqe(f) for f in out],
        "niqe_video_source": [niqe(f) for f in gt],
        "tecogan_weights_seed": 0,
        **temporal,
    }
    (FIXTURES / "reference_metrics.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
