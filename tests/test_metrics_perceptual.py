"""LPIPS (AlexNet, VGG; v0.1) and DISTS equal the reference packages (``lpips``, ``DISTS_pytorch``) on real
photographs with the same (seeded) weights, within 1e-5; the weight files are checked and never downloaded here."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from tests.support.metric_data import degrade, make_weights, photo, to_tensor
from utils.metrics import MetricError, resolve
from utils.metrics import weights as W
from utils.metrics.perceptual import DISTS, LPIPS
from utils.metrics.scorer import MetricSuite

# the reference packages call torchvision with deprecated arguments
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
lpips_pkg = pytest.importorskip("lpips")
dists_pkg = pytest.importorskip("DISTS_pytorch.DISTS_pt")
pytest.importorskip("skimage")


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_weights(str(tmp_path_factory.mktemp("metric_weights")))


@pytest.fixture(scope="module")
def pairs():
    """Two photographs (96 x 128) against their blurred / JPEG / noisy versions: (4, 3, H, W) each."""
    refs, dists = [], []
    for name, kind in (("astronaut", "blur"), ("coffee", "jpeg"), ("chelsea", "noise"), ("rocket", "jpeg")):
        img = photo(name, (96, 128))
        refs.append(to_tensor(img))
        dists.append(to_tensor(degrade(img, kind)))
    return torch.stack(refs), torch.stack(dists)


def _reference_lpips(net: str, weights: str) -> torch.nn.Module:
    heads = os.path.join(weights, W.WEIGHTS[f"lpips_{net}"].filename)
    ref = lpips_pkg.LPIPS(net=net, version="0.1", pretrained=True, pnet_rand=True, model_path=heads, verbose=False)
    backbone = W.load_weights({"alex": "alexnet", "vgg": "vgg16"}[net], weights, verify=False)
    for name, p in ref.named_parameters():
        if name.startswith("net."):  # net.slice<k>.<features index>.<weight|bias>
            _, _, idx, kind = name.split(".")
            p.data.copy_(backbone[f"features.{idx}.{kind}"])
    return ref.eval()


@pytest.mark.parametrize("net", ["alex", "vgg"])
def test_lpips_equals_the_lpips_package(net, weights, pairs, one_thread):
    x, y = pairs
    key = {"alex": "alexnet", "vgg": "vgg16"}[net]
    ours = LPIPS(net, W.load_weights(key, weights, verify=False), W.load_weights(f"lpips_{net}", weights, verify=False))
    with torch.no_grad():
        got = ours(x, y)
        want = _reference_lpips(net, weights)(x, y, normalize=True).flatten()
    assert want.min() > 0.01  # the seeded weights give values in the range of real LPIPS
    assert torch.allclose(got, want, rtol=0, atol=1e-5), (got, want)


def test_dists_equals_dists_pytorch(weights, pairs, one_thread, monkeypatch):
    x, y = pairs
    backbone = W.load_weights("vgg16", weights, verify=False)

    def vgg16(**_):  # DISTS_pytorch downloads torchvision's VGG16 in its constructor: give it ours instead
        import torchvision

        model = torchvision.models.vgg16(weights=None)
        model.features.load_state_dict({k[len("features."):]: v for k, v in backbone.items()})
        return model

    monkeypatch.setattr(dists_pkg, "models", type("models", (), {"vgg16": staticmethod(vgg16)}))
    ref = dists_pkg.DISTS(load_weights=False)
    alpha_beta = W.load_weights("dists", weights, verify=False)
    ref.alpha.data, ref.beta.data = alpha_beta["alpha"], alpha_beta["beta"]
    with torch.no_grad():
        got, want = DISTS(backbone, alpha_beta)(x, y), ref(x, y)
    assert torch.allclose(got, want, rtol=0, atol=1e-5), (got, want)
    assert (want > 1e-3).all()


def test_scorer_gives_the_same_lpips_on_uint8_frames(weights, pairs, one_thread):
    """The scorer feeds the networks the frames as saved (uint8-quantised): the same as the package on those."""
    x, y = pairs
    suite = MetricSuite(resolve(["lpips"], True), "cpu", weights, verify=False)
    rows = suite.scorer().update(x + 0.3 / 255, y, 0)  # off-grid values round back to the photographs
    with torch.no_grad():
        want = _reference_lpips("alex", weights)(x, y, normalize=True).flatten()
    assert torch.allclose(torch.tensor([r["lpips"] for r in rows]), want, rtol=0, atol=1e-5)


def test_published_weights_are_checked(weights, tmp_path):
    with pytest.raises(MetricError, match=r"alexnet-owt-7be5be79.pth have SHA-256 [0-9a-f]{64}, expected 7be5be79"):
        W.load_weights("alexnet", weights)  # the seeded stand-in is not torchvision's file
    with pytest.raises(MetricError) as err:
        MetricSuite(resolve(["dists"], True), "cpu", str(tmp_path))
    line = str(err.value)
    assert "\n" not in line and str(tmp_path / "vgg16-397923af.pth") in line
    assert "https://download.pytorch.org/models/vgg16-397923af.pth" in line and "--metric_weights" in line


def test_ensure_weights_fetches_once_checked(weights, tmp_path, monkeypatch):
    """The real fetch (utils_download through a file:// address): a good file lands, a bad digest lands nothing."""
    src = os.path.join(weights, W.WEIGHTS["lpips_alex"].filename)
    digest = hashlib.sha256(open(src, "rb").read()).hexdigest()
    for key in ("alexnet", "lpips_alex"):
        entry = W.WEIGHTS[key]
        url = "file://" + os.path.join(weights, entry.filename)
        sha = hashlib.sha256(open(url[7:], "rb").read()).hexdigest()
        monkeypatch.setitem(W.WEIGHTS, key, W.WeightFile(key, entry.filename, url, sha, entry.what))
    paths = W.ensure_weights(resolve(["tlp"], True), tmp_path / "ok")
    assert sorted(paths) == ["alexnet", "lpips_alex"] and all(os.path.isfile(p) for p in paths.values())
    monkeypatch.setitem(W.WEIGHTS, "lpips_alex", W.WeightFile("lpips_alex", "lpips_v0.1_alex.pth", "file://" + src,
                                                              "0" * 64, "heads"))
    with pytest.raises(MetricError, match=r"could not be downloaded \(Checksum mismatch"):
        W.ensure_weights(resolve(["lpips"], True), tmp_path / "bad")
    assert not os.path.exists(tmp_path / "bad" / "lpips_v0.1_alex.pth")
    assert digest  # the stand-in file itself was intact


def test_recorded_digests_match_the_published_heads(tmp_path):
    """The linear heads and DISTS' alpha/beta ship inside the reference wheels: our recorded SHA-256s are theirs,
    and the files load into our networks."""
    import shutil

    sources = {"lpips_alex": os.path.join(os.path.dirname(lpips_pkg.__file__), "weights", "v0.1", "alex.pth"),
               "lpips_vgg": os.path.join(os.path.dirname(lpips_pkg.__file__), "weights", "v0.1", "vgg.pth"),
               "dists": os.path.join(os.path.dirname(dists_pkg.__file__), "weights.pt")}
    for key, src in sources.items():
        shutil.copy(src, tmp_path / W.WEIGHTS[key].filename)
        state = W.load_weights(key, tmp_path)  # verify=True: the digest is checked
        assert state
    assert W.load_weights("dists", tmp_path)["alpha"].shape == (1, sum(DISTS.CHANS), 1, 1)
