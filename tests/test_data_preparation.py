"""Data preparation: MATLAB-compatible degradations, the LMDB writer/script, clip lists, REDS regrouping."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import cv2
import lmdb
import numpy as np
import pytest

from data.dataset_video_train import VideoRecurrentTrainDataset, read_meta_info
from scripts.data_preparation import create_lmdb, generate_lq, generate_meta_info, regroup_reds_dataset
from scripts.data_preparation.degradations import (
    bd_degrade,
    bi_degrade,
    cubic,
    gaussian_kernel_1d,
    imresize_matlab,
    to_uint8,
)
from utils.utils_lmdb import lmdb_image, make_lmdb_from_imgs, read_lmdb_meta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# KAIR's utils_image.imresize_np (a port of MATLAB imresize, float32) on default_rng(0).random((12, 16, 3)), x1/4
GOLDEN_CH0 = np.array([[0.47411248, 0.39073965, 0.62533844, 0.68522495],
                       [0.55647236, 0.5176605, 0.5329342, 0.5912428],
                       [0.54287386, 0.5241656, 0.5762659, 0.36612675]])
GOLDEN_PIX_1_2 = np.array([0.5329342, 0.5454309, 0.44453213])


def test_bicubic_matches_matlab_port():
    img = np.random.default_rng(0).random((12, 16, 3))
    out = imresize_matlab(img, 1 / 4)
    assert out.shape == (3, 4, 3)
    np.testing.assert_allclose(out[:, :, 0], GOLDEN_CH0, atol=1e-6)
    np.testing.assert_allclose(out[1, 2], GOLDEN_PIX_1_2, atol=1e-6)


def test_bicubic_kernel_and_constants():
    assert cubic(np.array([0.0]))[0] == 1 and cubic(np.array([1.0, 2.0, 2.5])).tolist() == [0, 0, 0]
    assert cubic(np.array([0.5]))[0] == pytest.approx(0.5625)  # 1.5/8 - 2.5/4 + 1
    assert cubic(np.array([1.5]))[0] == pytest.approx(-0.0625)  # -0.5*3.375 + 2.5*2.25 - 6 + 2
    const = np.full((20, 24, 3), 137, np.uint8)
    assert np.array_equal(to_uint8(bi_degrade(const)), np.full((5, 6, 3), 137, np.uint8))
    assert np.array_equal(to_uint8(bd_degrade(const)), np.full((5, 6, 3), 137, np.uint8))
    assert bi_degrade(np.zeros((18, 23), np.uint8)).shape == (4, 5)  # modcrop first
    # the interior of a linear ramp is reproduced exactly (the kernel reproduces linear functions)
    ramp = np.tile(np.arange(32, dtype=np.float64)[None, :], (8, 1)) / 31
    out = imresize_matlab(ramp, 1 / 4)
    np.testing.assert_allclose(out[:, 2:6], np.tile((4 * np.arange(2, 6) + 1.5) / 31, (2, 1)), atol=1e-12)


def test_bd_kernel_and_sampling():
    k = gaussian_kernel_1d(1.6)
    assert len(k) == 12 == math.ceil(3 * 1.6) * 2 + 2 and k.sum() == pytest.approx(1.0)
    assert np.outer(k, k).sum() == pytest.approx(1.0) and np.allclose(k, k[::-1])
    img = np.random.default_rng(1).random((16, 20))
    out = bd_degrade(img)
    assert out.shape == (4, 5)
    # independent evaluation of one output pixel: MATLAB imfilter(replicate) with the 12x12 fspecial kernel,
    # anchored at tap 6 (1-based) -> inputs i-5 .. i+6, sampled at 1-based (2 + 4 r, 2 + 4 c)
    x = np.arange(12) - 5.5
    k2 = np.exp(-(x[:, None] ** 2 + x[None, :] ** 2) / (2 * 1.6 ** 2))
    k2 /= k2.sum()
    r, c = 1, 0
    i, j = 1 + 4 * r, 1 + 4 * c
    acc = sum(k2[a, b] * img[min(max(i + a - 5, 0), 15), min(max(j + b - 5, 0), 19)]
              for a in range(12) for b in range(12))
    assert out[r, c] == pytest.approx(acc, abs=1e-12)


def test_to_uint8_rounds_like_matlab():
    assert to_uint8(np.array([2.5 / 255, 3.5 / 255, -0.1, 1.2])).tolist() == [3, 4, 0, 255]


def _write_clips(root: str, ext: str = "png", clips=("000", "001"), frames: int = 3) -> None:
    rng = np.random.default_rng(0)
    for clip in clips:
        os.makedirs(os.path.join(root, clip), exist_ok=True)
        for t in range(frames):
            cv2.imwrite(os.path.join(root, clip, f"{t:08d}.{ext}"), rng.integers(0, 255, (8, 12, 3), dtype=np.uint8))


def test_create_lmdb_round_trip_and_refuses_overwrite(tmp_path, capsys):
    src, out = str(tmp_path / "frames"), str(tmp_path / "frames.lmdb")
    _write_clips(src)
    _write_clips(src, "jpg", clips=("002",), frames=1)
    assert create_lmdb.main(["--input", src, "--output", out, "--workers", "1"]) == 0
    meta = read_lmdb_meta(out)
    assert [k for k, _ in meta] == ["000/00000000", "000/00000001", "000/00000002", "001/00000000", "001/00000001",
                                    "001/00000002", "002/00000000"]
    assert all(shape == (8, 12, 3) for _, shape in meta)
    assert open(os.path.join(out, "meta_info.txt")).readline() == "000/00000000.png (8,12,3) 1\n"
    for key, _ in meta:
        ext = "jpg" if key.startswith("002") else "png"
        assert np.array_equal(lmdb_image(out, key), cv2.imread(os.path.join(src, f"{key}.{ext}")))
    env = lmdb.open(out, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(b"002/00000000")[:8] == b"\x89PNG\r\n\x1a\n"  # JPEG re-encoded as PNG, like KAIR
    env.close()
    with pytest.raises(SystemExit):
        create_lmdb.main(["--input", src, "--output", out, "--workers", "1"])
    assert "already exists" in capsys.readouterr().err
    assert create_lmdb.main(["--input", src, "--output", out, "--workers", "2", "--overwrite", "--ext", "png",
                             "--key-scheme", "flat"]) == 0
    assert read_lmdb_meta(out)[0][0] == "000_00000000" and len(read_lmdb_meta(out)) == 6


def test_lmdb_map_grows_and_dataset_reads_script_output(tmp_path):
    gt, lq = str(tmp_path / "gt"), str(tmp_path / "lq")
    for clip in ("000", "003"):
        for t in range(4):
            img = np.random.default_rng(t).integers(0, 255, (6, 5, 3), dtype=np.uint8)
            for root, im in ((lq, img), (gt, img.repeat(4, 0).repeat(4, 1))):
                os.makedirs(os.path.join(root, clip), exist_ok=True)
                cv2.imwrite(os.path.join(root, clip, f"{t:08d}.png"), im)
    rels = sorted(f"{c}/{t:08d}.png" for c in ("000", "003") for t in range(4))
    make_lmdb_from_imgs(gt, gt + ".lmdb", rels, [r[:-4] for r in rels], batch=3, n_thread=1, map_size=4096,
                        progress=False)  # tiny map: must grow while writing
    assert len(read_lmdb_meta(gt + ".lmdb")) == 8
    create_lmdb.main(["--input", lq, "--output", lq + ".lmdb", "--workers", "1"])
    meta = str(tmp_path / "meta.txt")
    generate_meta_info.main(["--input", gt, "--output", meta])
    assert open(meta).read() == "000 4 (24,20,3) 00000000\n003 4 (24,20,3) 00000000\n"
    opt = {"dataroot_gt": gt + ".lmdb", "dataroot_lq": lq + ".lmdb", "meta_info_file": meta, "num_frame": 2,
           "gt_size": 16, "scale": 4, "io_backend": {"type": "lmdb"}}
    assert VideoRecurrentTrainDataset(opt)[5]["H"].shape == (2, 3, 16, 16)


def test_meta_info_files(tmp_path):
    reds = read_meta_info(os.path.join(ROOT, "data", "meta_info", "meta_info_REDS_GT.txt"), 4)
    assert len(reds) == 270 and reds[0] == ("000", 100, 0) and reds[-1] == ("269", 100, 0)
    seqs = tmp_path / "seq"
    for s in ("00001/0001", "00001/0002"):
        for n in range(1, 8):
            (seqs / s).mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(seqs / s / f"im{n}.png"), np.zeros((4, 6, 3), np.uint8))
    out = str(tmp_path / "vimeo.txt")
    generate_meta_info.main(["--format", "vimeo", "--input", str(seqs), "--output", out])
    assert open(out).read() == "00001/0001 7 (4,6,3)\n00001/0002 7 (4,6,3)\n"
    gap = tmp_path / "gap" / "clip"
    gap.mkdir(parents=True)
    for t in (0, 1, 3):
        cv2.imwrite(str(gap / f"{t:05d}.png"), np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="clip: frames not consecutive after 1"):
        generate_meta_info.main(["--input", str(tmp_path / "gap"), "--output", str(tmp_path / "g.txt")])


def test_regroup_reds(tmp_path):
    root = tmp_path / "REDS"
    _write_clips(str(root / "train_sharp"), clips=("000",), frames=1)
    _write_clips(str(root / "val_sharp"), clips=("000", "029"), frames=1)
    assert regroup_reds_dataset.main(["--root", str(root)]) == 0
    assert sorted(os.listdir(root / "train_sharp")) == ["000", "240", "269"]
    assert os.path.isdir(root / "val_sharp" / "029")  # copied, not moved
    assert regroup_reds_dataset.main(["--root", str(root)]) == 0  # idempotent


def test_generate_lq_cli(tmp_path):
    src = str(tmp_path / "hr")
    _write_clips(src, clips=("a",), frames=1)
    os.remove(os.path.join(src, "a", "00000000.png"))
    img = np.random.default_rng(3).integers(0, 255, (16, 24, 3), dtype=np.uint8)
    cv2.imwrite(os.path.join(src, "a", "x.png"), img)
    for kind, fn in (("bi", bi_degrade), ("bd", bd_degrade)):
        out = str(tmp_path / kind)
        assert generate_lq.main(["--input", src, "--output", out, "--degradation", kind, "--workers", "1"]) == 0
        got = cv2.imread(os.path.join(out, "a", "x.png"))
        assert got.shape == (4, 6, 3) and np.array_equal(got, to_uint8(fn(img)))


def test_scripts_run_from_repo_root():
    for script in ("create_lmdb.py", "generate_meta_info.py", "generate_lq.py", "regroup_reds_dataset.py"):
        res = subprocess.run([sys.executable, os.path.join("scripts", "data_preparation", script), "--help"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "usage" in res.stdout, res.stderr


RECIPES = ([f"options/vrt/{n}" for n in sorted(os.listdir(os.path.join(ROOT, "options", "vrt"))) if n[:3] != "000"]
           + [f"options/rvrt/{n}" for n in sorted(os.listdir(os.path.join(ROOT, "options", "rvrt")))])


def test_recipe_option_files():
    import inspect

    from data.select_dataset import DATASETS
    from models.select_network import NETWORKS, network_kwargs
    from utils import utils_option

    assert len(RECIPES) == 19  # V01-V09, R01-R06, and the real-world pixel and GAN stages (V10, R07)
    for rel in RECIPES:
        opt = utils_option.parse(os.path.join(ROOT, rel))
        assert opt["task"] == os.path.basename(rel)[:-5]
        net = opt["netG"]
        inspect.signature(NETWORKS[net["net_type"]]).bind(**network_kwargs(net))  # every netG key is accepted
        train = opt["datasets"]["train"]
        assert train["dataset_type"].lower() in DATASETS and opt["datasets"]["test"]["dataset_type"].lower() in DATASETS
        if "REDS" in train["dataroot_gt"]:
            assert train["val_partition"] == "REDS4"  # REDS4 is the test set of every REDS recipe
        if "vimeo" in train["dataroot_gt"]:
            assert train["dataroot_gt"].endswith("vimeo90k_train_GT_all.lmdb") and train["num_frame"] == 7
    v07 = utils_option.parse(os.path.join(ROOT, "options/vrt/007_train_vrt_videodeblurring_reds.json"))
    assert v07["datasets"]["train"]["dataroot_lq"] == "trainsets/REDS/train_blur_with_val.lmdb"
    v02 = utils_option.parse(os.path.join(ROOT, "options/vrt/002_train_vrt_videosr_bi_reds_16frames.json"))
    assert v02["datasets"]["train"]["num_frame"] == v02["netG"]["img_size"][0] == 16
