"""main_test_vrt.py end to end on tiny generated inputs, plus the task table and the per-clip post-processing."""

from __future__ import annotations

import copy
import csv
import inspect
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from data.dataset_video_file import read_video, write_video
from engine import evaluate as utils_test
from models.model_zoo import TASKS, TaskSpec
from models.net_io import NetIO, net_io
from models.network_vrt import VRT
from models.select_network import NETWORKS
from tests.support.helpers import ROOT, TINY_OPT, base_env
from tests.support.video_helpers import FPS, audio_packets, write_sine
from utils.utils_image import frame_metrics, imread_rgb, imwrite_rgb

TINY_NET = {
    "net_type": "vrt", "upscale": 4, "img_size": [2, 40, 40], "window_size": [2, 4, 4], "depths": [1] * 7 + [1, 1],
    "embed_dims": [16] * 7 + [24, 24], "num_heads": [2] * 9, "indep_reconsts": [8], "drop_path_rate": 0.0,
    "deformable_groups": 4, "pa_frames": 2,
}
LINE = re.compile(r"Testing (\S+)\s+\(\s*\d+/\d+\) - PSNR: ([\d.]+) dB; SSIM: ([\d.]+); PSNR_Y: ([\d.]+) dB")
AVERAGE = re.compile(r"-- Average PSNR: ([\d.]+) dB; SSIM: ([\d.]+); PSNR_Y: ([\d.]+) dB; SSIM_Y: ([\d.]+)")


def _smooth_frames(gen: torch.Generator, frames: int, size: int) -> torch.Tensor:
    """``(T, 3, size, size)`` smooth random content that drifts between frames."""
    base = torch.rand(1, 3, 6, 6, generator=gen)
    out = []
    for t in range(frames):
        shifted = torch.roll(base, shifts=t, dims=-1)
        out.append(torch.nn.functional.interpolate(shifted, size=(size, size), mode="bicubic", align_corners=False))
    return torch.cat(out).clamp(0, 1)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny trained-looking checkpoint, its option file, two frame-folder clips and a pair of videos."""
    tmp = tmp_path_factory.mktemp("eval")
    opt = copy.deepcopy(TINY_OPT)
    opt.update(netG=TINY_NET, val={"num_frame_testing": 0, "size_patch_testing": 0})
    opt["path"]["root"] = str(tmp / "experiments")
    opt_path = str(tmp / "tiny.json")
    with open(opt_path, "w") as f:
        json.dump(opt, f)
    torch.manual_seed(0)
    net = VRT(**{k: v for k, v in TINY_NET.items() if k != "net_type"})
    ckpt = tmp / "experiments" / "tiny" / "models" / "5_G.pth"
    ckpt.parent.mkdir(parents=True)
    torch.save({"params": {f"module.{k}": v for k, v in net.state_dict().items()}}, ckpt)
    gen = torch.Generator().manual_seed(0)
    for clip, frames in (("000", 3), ("001", 2)):
        gt = _smooth_frames(gen, frames, 192)
        lq = torch.nn.functional.interpolate(gt, scale_factor=0.25, mode="bicubic", align_corners=False)
        for t in range(frames):
            imwrite_rgb(str(tmp / "gt" / clip / f"{t:08d}.png"), gt[t])
            imwrite_rgb(str(tmp / "lq" / clip / f"frame{t:03d}.png"), lq[t].clamp(0, 1))
    gt = _smooth_frames(gen, 3, 192)
    write_video(str(tmp / "videos_gt" / "walk.avi"), gt, fps=FPS)  # .avi: lossless FFV1
    lq = torch.nn.functional.interpolate(gt, scale_factor=0.25, mode="bicubic", align_corners=False)
    write_sine(str(tmp / "walk.wav"), float(3 / FPS))
    write_video(str(tmp / "videos_lq" / "walk.avi"), lq, fps=FPS, audio_from=str(tmp / "walk.wav"))
    return {"tmp": tmp, "opt": opt_path, "ckpt": str(ckpt)}


def _run_cli(args: list[str], cwd) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "main_test_vrt.py"), *args], cwd=str(cwd),
                          env=base_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _check_printed_psnr(stdout: str, save_dir, gt_frames: dict[str, list[np.ndarray]]) -> None:
    """The printed PSNRs are those of the written PNGs against the GT (per clip and averaged)."""
    printed = {m.group(1): float(m.group(2)) for m in LINE.finditer(stdout)}
    assert set(printed) == set(gt_frames), stdout
    clip_means = []
    csv_rows = list(csv.DictReader(open(os.path.join(save_dir, "metrics.csv"))))
    for clip, gts in gt_frames.items():
        names = sorted(os.listdir(os.path.join(save_dir, clip)))
        assert len(names) == len(gts)  # one output per input frame
        metrics = []
        for name, gt in zip(names, gts):
            out = imread_rgb(os.path.join(save_dir, clip, name))
            metrics.append(frame_metrics(torch.from_numpy(out).permute(2, 0, 1), torch.from_numpy(gt).permute(2, 0, 1)))
        psnr = float(np.mean([m["psnr"] for m in metrics]))
        assert abs(psnr - printed[clip]) <= 0.005 + 1e-9
        rows = [r for r in csv_rows if r["folder"] == clip]
        assert [r["frame"] for r in rows] == [os.path.splitext(n)[0] for n in names]
        for row, m in zip(rows, metrics):
            for key in ("psnr", "ssim", "psnr_y", "ssim_y"):
                assert float(row[key]) == pytest.approx(m[key], abs=1e-9)
        clip_means.append(psnr)
    average = AVERAGE.search(stdout)
    assert average is not None, stdout
    assert abs(float(average.group(1)) - np.mean(clip_means)) <= 0.005 + 1e-9


def test_folders_with_checkpoint_and_tiling(workspace) -> None:
    tmp = workspace["tmp"]
    proc = _run_cli(["--opt", workspace["opt"], "--model_path", workspace["ckpt"], "--folder_lq", str(tmp / "lq"),
                     "--folder_gt", str(tmp / "gt"), "--tile", "2", "40", "40", "--tile_overlap", "1", "8", "8",
                     "--num_workers", "0", "--save_result", "--device", "cpu"], cwd=tmp)
    save_dir = tmp / "results" / "tiny"
    assert sorted(os.listdir(save_dir / "000")) == ["frame000.png", "frame001.png", "frame002.png"]
    gts = {clip: [imread_rgb(str(p)) for p in sorted((tmp / "gt" / clip).iterdir())] for clip in ("000", "001")}
    _check_printed_psnr(proc.stdout, str(save_dir), gts)


def test_video_file_with_checkpoint(workspace, caplog, monkeypatch) -> None:
    """In this process (the entry script itself runs in the test above)."""
    tmp = workspace["tmp"]
    save_dir = tmp / "video_results"
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with caplog.at_level(logging.INFO):
        assert utils_test.main(["--opt", workspace["opt"], "--folder_lq", str(tmp / "videos_lq" / "walk.avi"),
                                "--folder_gt", str(tmp / "videos_gt" / "walk.avi"), "--num_workers", "0",
                                "--save_result", "--save_video", "--save_dir", str(save_dir), "--device", "cpu"]) == 0
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert "loading model from" in log and "5_G.pth" in log  # newest checkpoint of --opt
    assert sorted(os.listdir(save_dir / "walk")) == ["00000000.png", "00000001.png", "00000002.png"]
    restored, fps = read_video(str(save_dir / "walk.mp4"))  # H.264, with the input's frame rate and audio
    assert restored.shape == (3, 3, 192, 192) and fps == FPS
    assert b"".join(audio_packets(str(save_dir / "walk.mp4"))) == b"".join(audio_packets(str(tmp / "walk.wav")))
    gt, _ = read_video(str(tmp / "videos_gt" / "walk.avi"))
    _check_printed_psnr(log, str(save_dir), {"walk": [g.permute(1, 2, 0).numpy() for g in gt]})


def test_missing_released_model_is_one_clear_error(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.ERROR):
        code = utils_test.main(["--task", "008_VRT_videodenoising_DAVIS", "--folder_lq", str(tmp_path)])
    assert code == 2
    message = caplog.text
    assert "model_zoo/vrt/008_VRT_videodenoising_DAVIS.pth" in message
    assert "https://github.com/JingyunLiang/VRT/releases/download/v0.0/008_VRT_videodenoising_DAVIS.pth" in message
    with caplog.at_level(logging.ERROR):
        assert utils_test.main(["--task", "nope"]) == 2
    assert "001_VRT_videosr_bi_REDS_6frames" in caplog.text


def test_task_table_matches_the_official_scripts() -> None:
    assert len([t for t in TASKS.values() if t.net_type == "vrt"]) == 9
    assert len([t for t in TASKS.values() if t.net_type == "rvrt"]) == 6
    ios = {}
    for spec in TASKS.values():
        cls = NETWORKS[spec.net_type]
        params = inspect.signature(cls.__init__).parameters
        assert set(spec.kwargs) <= set(params), spec.name
        with torch.device("meta"):  # what the released network eats, without its weights
            ios[spec.name] = io = net_io(cls(**spec.net_kwargs()))
        assert spec.tile[1] % io.input_multiple[-1] == 0
    assert ios["001_VRT_videosr_bi_REDS_6frames"] == NetIO(3, 3, 4, False, False, (6, 8, 8), 40, 2)
    assert ios["008_VRT_videodenoising_DAVIS"].in_chans == 4 and ios["008_VRT_videodenoising_DAVIS"].noise_map
    assert ios["006_RVRT_videodenoising_DAVIS_16frames"].describe_input() == "4 (RGB + noise-level map)"
    assert ios["004_RVRT_videodeblurring_DVD_16frames"].scale == 1
    assert TASKS["002_VRT_videosr_bi_REDS_16frames"].kwargs["pa_frames"] == 6
    vfi = TASKS["009_VRT_videofi_Vimeo_4frames"]
    assert ios[vfi.name].frame_interpolation and ios[vfi.name].temporal_tile == 0
    assert vfi.kwargs["pa_frames"] == 0 and "deformable_groups" not in vfi.kwargs
    assert TASKS["006_RVRT_videodenoising_DAVIS_16frames"].kwargs["inputconv_groups"] == [1, 3, 4, 6, 8, 4]
    assert TASKS["002_RVRT_videosr_bi_Vimeo_14frames"].url.startswith("https://github.com/JingyunLiang/RVRT/")
    spec = TASKS["001_VRT_videosr_bi_REDS_6frames"]
    spec.net_kwargs()["depths"].append(1)
    assert len(spec.kwargs["depths"]) == 13  # net_kwargs hands out copies


class _Recorder(torch.nn.Module):
    """Per-frame, per-pixel net: output frame t = input frame t (RGB) + t-th marker; records its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inputs.append(x.clone())
        return x[:, :, :3] + torch.arange(x.shape[1], dtype=x.dtype).view(1, -1, 1, 1, 1)


def _setup(net, **kw) -> utils_test.TestSetup:
    io = NetIO(in_chans=4 if kw.pop("nonblind_denoising", False) else 3, input_multiple=(2, 8, 8))
    io = NetIO(**{**io.__dict__, "noise_map": io.in_chans == 4})
    base = {"name": "t", "net": net, "io": io, "tile": (0, 0), "tile_overlap": (2, 20), "vimeo_mirror": False,
            "sigma": 0}
    return utils_test.TestSetup(**{**base, **kw})


def test_rvrt_vimeo_mirror_average_and_vrt_centre_frame() -> None:
    lq = torch.rand(7, 3, 16, 16)
    mirrored = torch.cat([lq, lq.flip(0)])
    out = utils_test.restore_clip(_setup(_Recorder(), vimeo_mirror=True), {"L": mirrored}, torch.device("cpu"),
                                  None, vimeo=True)
    torch.testing.assert_close(out, ((mirrored[3] + 3 + mirrored[10] + 10) / 2)[None])
    padded = torch.cat([lq, lq[-1:]])
    out = utils_test.restore_clip(_setup(_Recorder()), {"L": padded}, torch.device("cpu"), None, vimeo=True)
    torch.testing.assert_close(out, (padded[3] + 3)[None])


def test_nonblind_denoising_without_gt_appends_the_sigma_map() -> None:
    net = _Recorder()
    noisy = torch.rand(2, 3, 16, 16)
    out = utils_test.restore_clip(_setup(net, nonblind_denoising=True, sigma=30), {"L": noisy}, torch.device("cpu"),
                                  None, vimeo=False)
    assert out.shape == (2, 3, 16, 16)
    assert net.inputs[0].shape[2] == 4
    torch.testing.assert_close(net.inputs[0][0, :, 3], torch.full((2, 16, 16), 30 / 255))
    torch.testing.assert_close(net.inputs[0][0, :, :3], noisy)  # the input is taken as already noisy


def test_task_spec_missing_file_message(tmp_path) -> None:
    spec: TaskSpec = TASKS["004_RVRT_videodeblurring_DVD_16frames"]
    assert spec.default_model_path == os.path.join("model_zoo", "rvrt", "004_RVRT_videodeblurring_DVD_16frames.pth")
    with pytest.raises(FileNotFoundError, match="RVRT/releases/download/v0.0/004_RVRT"):
        spec.check_model_file(str(tmp_path / "x.pth"))


def test_video_dataset_synthesises_noise_only_for_denoising(workspace) -> None:
    tmp = workspace["tmp"]
    args = utils_test.build_parser().parse_args(["--folder_lq", str(tmp / "videos_gt"), "--folder_gt",
                                                 str(tmp / "videos_gt"), "--sigma", "20"])
    noisy = utils_test.build_test_set(args, _setup(None, nonblind_denoising=True, sigma=20))[0]
    assert noisy["L"].shape[1] == 4 and noisy["folder"] == "walk"
    torch.testing.assert_close(noisy["L"][:, 3], torch.full_like(noisy["L"][:, 3], 20 / 255))
    assert 0.05 < float((noisy["L"][:, :3] - noisy["H"]).std()) < 0.11
    plain = utils_test.build_test_set(args, _setup(None, sigma=20))[0]
    torch.testing.assert_close(plain["L"], plain["H"])


def test_option_file_gives_the_denoising_sigma(tmp_path) -> None:
    """With ``--opt``, a non-blind denoiser's noise level is the recipe's ``datasets.test.sigma`` unless ``--sigma``
    says otherwise (a silent 0 would score a denoiser on clean input)."""
    from models.select_network import define_G
    from tests.support.helpers import VRT_TINY_OPT

    opt = copy.deepcopy(VRT_TINY_OPT)
    opt["datasets"]["test"] = {"name": "test", "dataset_type": "VideoRecurrentTestDataset", "dataroot_gt": "gt",
                               "dataroot_lq": "gt", "sigma": 30}
    opt["path"]["root"] = str(tmp_path)
    (tmp_path / "opt.json").write_text(json.dumps(opt))
    weights = tmp_path / "w.pth"
    torch.save({"params": define_G(opt).state_dict()}, weights)
    common = ["--opt", str(tmp_path / "opt.json"), "--model_path", str(weights)]
    assert utils_test.setup_model(utils_test.build_parser().parse_args(common)).sigma == 30
    assert utils_test.setup_model(utils_test.build_parser().parse_args([*common, "--sigma", "10"])).sigma == 10


def _opt_and_weights(tmp_path, netg: dict, scale: int, **sections) -> list[str]:
    """``--opt``/``--model_path`` flags of a tiny network (fresh weights) with a clip-folder test set."""
    from models.select_network import define_G

    opt = copy.deepcopy(TINY_OPT)
    opt.update(netG=netg, scale=scale, **sections)
    opt["datasets"]["test"] = {"name": "test", "dataset_type": "VideoRecurrentTestDataset", "dataroot_gt": "gt",
                               "dataroot_lq": "lq", **opt["datasets"].get("test_extra", {})}
    opt["datasets"].pop("test_extra", None)
    opt["path"]["root"] = str(tmp_path)
    (tmp_path / "opt.json").write_text(json.dumps(opt))
    torch.save({"params": define_G(opt).state_dict()}, tmp_path / "w.pth")
    return ["--opt", str(tmp_path / "opt.json"), "--model_path", str(tmp_path / "w.pth")]


def test_a_test_set_sigma_for_a_network_without_a_noise_map_is_refused(tmp_path) -> None:
    """As training refuses it, and as an explicit --sigma is: one line naming both numbers."""
    from models.net_io import InputMismatch
    from tests.support.networks import tiny_net

    datasets = {**TINY_OPT["datasets"], "test_extra": {"sigma": 30}}
    flags = _opt_and_weights(tmp_path, tiny_net("videoconvbaseline", "deblur"), 1, datasets=datasets)
    with pytest.raises(InputMismatch, match=r"^datasets\.test\.sigma 30 \(which adds a noise-level map\) gives 4 "
                                            r"input channels but the network reads 3 \(RGB\)"):
        utils_test.setup_model(utils_test.build_parser().parse_args(flags))


def test_the_temporal_tile_and_overlap_default_to_the_networks(tmp_path) -> None:
    """BasicVSR++ states 100-frame tiles overlapping by 10: main_test_vrt takes both unless val or the flags say."""
    from tests.support.networks import tiny_net

    flags = _opt_and_weights(tmp_path, tiny_net("basicvsrpp"), 4)
    setup = utils_test.setup_model(utils_test.build_parser().parse_args(flags))
    assert (setup.tile[0], setup.tile_overlap[0]) == (setup.io.temporal_tile, setup.io.temporal_overlap) == (100, 10)
    given = utils_test.setup_model(utils_test.build_parser().parse_args(
        [*flags, "--set", "val.num_frame_overlapping=3"]))
    assert (given.tile[0], given.tile_overlap[0]) == (100, 3)
    short = utils_test.setup_model(utils_test.build_parser().parse_args([*flags, "--set", "val.num_frame_testing=6"]))
    assert (short.tile[0], short.tile_overlap[0]) == (6, 5)  # the recommended overlap fits the given tile
    assert NetIO(temporal_tile=0, temporal_overlap=2).temporal_tiling(None, None) == (0, 2)
