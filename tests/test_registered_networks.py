"""Every registered network, every task form it supports (SR, denoising with the noise-level map, deblurring, frame
interpolation), through every entry point: training with validation, ``main_test_vrt.py --opt`` on frame folders
and on a video file, and two processes. What a network eats comes from its ``io`` (models/net_io.py) alone."""

from __future__ import annotations

import csv
import json
import os
import sys

import pytest
import torch

import main_test_vrt  # noqa: F401  (the entry script must import cleanly)
import main_train_vrt
from data.dataset_synthetic import SyntheticVideoTestDataset
from data.dataset_video_file import write_video
from engine import eval_setup, evaluate
from models.net_io import InputMismatch, NetIO, net_io
from models.select_network import NETWORKS, define_G, define_network, network_kwargs
from tests.support.helpers import ROOT, TORCHRUN_ENTRY, assert_ok, base_env, run, write_opt
from tests.support.networks import CASES, FORMS, TINY_NETS, lq_size, tiny_net
from utils.utils_image import imread_rgb, imwrite_rgb


def test_every_registered_network_has_tiny_configs_for_its_task_forms():
    assert set(TINY_NETS) == set(NETWORKS) == set(FORMS)
    for net_type in NETWORKS:
        for form in FORMS[net_type]:
            io = net_io(define_network(net_type, network_kwargs(tiny_net(net_type, form))))
            assert io.noise_map == (form == "denoise") and io.in_chans == 3 + (form == "denoise")
            assert io.frame_interpolation == (form == "vfi") and io.scale == (4 if form == "sr" else 1)


def _opt(tmp_path, net_type: str, form: str, **extra) -> str:
    size = lq_size(net_type, form)
    scale = 4 if form == "sr" else 1
    gt = size * scale + 4 * scale  # the random crop's room
    train = {"dataset_type": "SyntheticVideoTrainDataset", "task": form, "gt_size": gt, "num_frame": 2,
             "num_clips": 2, "scale": None, "use_rot": False}
    test = {"task": form, "lq_size": [size, size], "num_frame": 2, "num_clips": 1, "scale": None}
    sections = {"netG": tiny_net(net_type, form), "scale": scale, "task": form, "datasets": {"train": train,
                "test": test}, "train": {"total_iter": 1, "checkpoint_save": 1, "checkpoint_test": 1}}
    for key, value in extra.items():
        sections[key] = {**sections[key], **value} if isinstance(value, dict) else value
    return write_opt(tmp_path, f"{net_type}_{form}.json", **sections)


def _write_clips(root: str, form: str, size: int) -> tuple[str, str]:
    """One 4-frame synthetic clip as the official folder layout ``root/{lq,gt}/<clip>/<frame>.png`` (frame
    interpolation: a Vid4-style folder of GT frames, from which the odd frames are interpolated)."""
    frames = 7 if form == "vfi" else 4
    data = SyntheticVideoTestDataset({"task": "sr" if form == "vfi" else form, "num_clips": 1, "num_frame": frames,
                                      "lq_size": [size, size], "seed": 3, "scale": 4 if form == "sr" else 1})
    item = data[0]
    lq = item["L"][:, :3]
    if form == "denoise":  # main_test_vrt adds the noise (and the map) to the GT itself, as the official script
        lq = item["H"]
    for side, clip in (("lq", lq), ("gt", item["H"])):
        for t, frame in enumerate(clip):
            imwrite_rgb(os.path.join(root, side, "clip", f"{t:08d}.png"), frame)
    return os.path.join(root, "lq"), os.path.join(root, "gt")


def _write_videos(root: str, lq_dir: str, gt_dir: str) -> tuple[str, str]:
    """The clip folders as lossless FFV1 videos."""
    out = []
    for side, folder in (("lq", lq_dir), ("gt", gt_dir)):
        names = sorted(os.listdir(os.path.join(folder, "clip")))
        frames = torch.stack([torch.from_numpy(imread_rgb(os.path.join(folder, "clip", n))).permute(2, 0, 1)
                              for n in names])
        path = os.path.join(root, "video_" + side, "clip.mkv")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_video(path, frames)
        out.append(path)
    return out[0], out[1]


def _scores(save_dir: str) -> list[float]:
    with open(os.path.join(save_dir, "metrics.csv")) as f:
        return [float(r["psnr"]) for r in csv.DictReader(f)]


def _evaluate(opt: str, task: str, lq: str, gt: str, save: str, form: str) -> list[float]:
    sigma = ["--sigma", "30"] if form == "denoise" else []
    code = evaluate.main(["--opt", opt, "--set", f"task={task}", "--folder_lq", lq, "--folder_gt", gt, *sigma,
                          "--device", "cpu", "--num_workers", "0", "--save_dir", save])
    assert code == 0
    return _scores(save)


def _kair_test_set(opt: str, lq: str, gt: str) -> None:
    """Validate on the clip folders with KAIR's test-set type, carrying a key only its sibling (REDS's train set)
    reads: accepted, with a note that must reach train.log."""
    with open(opt) as f:
        tree = json.load(f)
    tree["datasets"]["test"] = {"name": "test", "dataset_type": "VideoRecurrentTestDataset", "dataroot_lq": lq,
                                "dataroot_gt": gt, "val_partition": "REDS4"}
    with open(opt, "w") as f:
        json.dump(tree, f)


def _spy_noise_maps(monkeypatch) -> list[torch.Tensor]:
    """The distinct values of the noise-level channel of every input the evaluated network gets."""
    seen: list[torch.Tensor] = []

    def build(opt):
        net = define_G(opt)
        net.register_forward_pre_hook(lambda _, args: seen.append(args[0][:, :, -1].unique()))
        return net

    monkeypatch.setattr(eval_setup, "define_G", build)
    return seen


@pytest.mark.parametrize("net_type,form", CASES)
def test_trains_validates_and_evaluates_in_every_task_form(net_type, form, tmp_path, monkeypatch, one_thread,
                                                           capsys):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    task = f"{net_type}_{form}"
    opt = _opt(tmp_path, net_type, form)
    size = lq_size(net_type, form)
    vid4 = os.path.join(str(tmp_path), "vid4")  # frame interpolation: the official Vid4 layout and rules
    lq, gt = _write_clips(vid4 if form == "vfi" else str(tmp_path / "clips"), form, size)
    if form == "sr":
        _kair_test_set(opt, lq, gt)
    assert main_train_vrt.main(["--opt", opt, "--set", f"task={task}"]) == 0
    exp = tmp_path / "experiments" / task
    assert (exp / "models" / "1_G.pth").is_file() and (exp / "models" / "1_state.pth").is_file()
    log = (exp / "train.log").read_text()
    assert "Average PSNR" in log and "Input baseline" in log  # validation during training ran
    if form == "sr":  # the note of parsing time reaches the experiment's log
        assert "option 'datasets.test.val_partition' has no effect for this dataset type" in log
    saved = [p for p in os.listdir(exp / "options") if p.endswith(".json")]
    assert json.load(open(exp / "options" / saved[0]))["netG"]["net_type"] == net_type

    if form == "vfi":
        lq = gt
    maps = _spy_noise_maps(monkeypatch) if form == "denoise" else []
    folders = _evaluate(opt, task, lq, gt, str(tmp_path / "results_folders"), form)
    assert len(folders) == (3 if form == "vfi" else 4) and all(p > 10 for p in folders)  # a real restoration
    lq_video, gt_video = _write_videos(str(tmp_path), lq, gt)
    if form == "vfi":  # refused before any work, in one line: a video file is no interpolation test layout
        capsys.readouterr()
        save = tmp_path / "results_video"
        assert evaluate.main(["--opt", opt, "--set", f"task={task}", "--folder_lq", lq_video, "--folder_gt",
                              gt_video, "--device", "cpu", "--num_workers", "0", "--save_dir", str(save)]) == 2
        out = capsys.readouterr()  # (the training's logger set-up writes the log to the console)
        errors = [ln for ln in (out.out + out.err).splitlines() if "error: " in ln]
        assert len(errors) == 1 and "frame interpolation is tested on the frame folders" in errors[0], errors
        assert "its 4 frames" in errors[0] and not save.exists() and "%|" not in out.err  # no progress bar
        return
    videos = _evaluate(opt, task, lq_video, gt_video, str(tmp_path / "results_video"), form)
    # lossless video: the same frames, the same scores (denoising: the same seeded noise and noise-level map)
    assert len(videos) == 4 and videos == pytest.approx(folders, abs=1e-6)
    if form == "denoise":  # the map main_test_vrt adds is sigma / 255, on frame folders and on video files
        expected = torch.tensor([30 / 255], dtype=torch.float32)
        assert len(maps) >= 2 and all(torch.equal(m, expected) for m in maps), maps


def test_two_processes_train_and_evaluate_every_network(tmp_path, monkeypatch, one_thread):
    """One torchrun job of 2 processes trains each network (SR form) with validation and evaluates it on frame
    folders, and trains the conv baseline's denoiser and evaluates it on a video file (noise-level map from
    --sigma, the clip cut into segments shared by the 2 processes): equal to one process."""
    sizes = {lq_size(net_type, "sr") for net_type in NETWORKS}
    clips = {size: _write_clips(str(tmp_path / f"clips{size}"), "sr", size) for size in sizes}
    jobs = [{"opt": _opt(tmp_path, net_type, "sr", task=f"dist_{net_type}"), "lq": clips[lq_size(net_type, "sr")][0],
             "gt": clips[lq_size(net_type, "sr")][1], "args": []} for net_type in sorted(NETWORKS)]
    lq_video, gt_video = _write_videos(str(tmp_path / "denoise"), *_write_clips(str(tmp_path / "noisy"),
                                                                                 "denoise", 16))
    denoise = ["--sigma", "30", "--tile", "2", "0", "--tile_overlap", "1", "0", "--segment_frames", "2"]
    jobs.append({"opt": _opt(tmp_path, "videoconvbaseline", "denoise", task="dist_denoise"), "lq": lq_video,
                 "gt": gt_video, "args": denoise})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    entry = os.path.join(ROOT, "tests", "support", "networks_entry.py")
    proc = run([sys.executable, TORCHRUN_ENTRY, "--standalone", "--nproc_per_node=2", entry, "jobs.json"],
               base_env(threads=1), str(tmp_path), timeout=300)
    assert_ok(proc)
    for net_type in NETWORKS:
        assert (tmp_path / "experiments" / f"dist_{net_type}" / "models" / "1_state.pth").is_file()
        scores = _scores(str(tmp_path / "results" / f"dist_{net_type}"))
        assert len(scores) == 4 and all(p > 10 for p in scores), net_type
    markers = [json.loads(p.read_text()) for p in (tmp_path / "results" / "dist_denoise").rglob("*.json")]
    assert {m["rank"] for m in markers if "segment" in m} == {0, 1}  # both processes restored part of the video
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    code = evaluate.main(["--opt", jobs[-1]["opt"], "--folder_lq", lq_video, "--folder_gt", gt_video, *denoise,
                          "--device", "cpu", "--num_workers", "0", "--save_dir", str(tmp_path / "one")])
    assert code == 0
    assert _scores(str(tmp_path / "results" / "dist_denoise")) == _scores(str(tmp_path / "one"))


# ----- what a network eats is checked against the data before any work
def _io(net_type: str, form: str) -> NetIO:
    return net_io(define_network(net_type, network_kwargs(tiny_net(net_type, form))))


def test_a_denoiser_without_a_noise_level_is_one_line_before_any_work(tmp_path, monkeypatch, caplog, one_thread):
    monkeypatch.chdir(tmp_path)
    opt = _opt(tmp_path, "videoconvbaseline", "denoise")
    with open(opt) as f:
        tree = json.load(f)
    tree["datasets"]["test"]["sigma"] = 0
    with open(opt, "w") as f:
        json.dump(tree, f)
    models = tmp_path / "experiments" / "d" / "models"
    models.mkdir(parents=True)
    net = define_network("videoconvbaseline", network_kwargs(tiny_net("videoconvbaseline", "denoise")))
    torch.save({"params": net.state_dict()}, models / "1_G.pth")
    lq, gt = _write_clips(str(tmp_path / "clips"), "denoise", 16)
    save = tmp_path / "results"
    code = evaluate.main(["--opt", opt, "--set", "task=d", "--folder_lq", lq, "--folder_gt", gt,
                          "--device", "cpu", "--num_workers", "0", "--save_dir", str(save)])
    assert code == 2 and not save.exists()
    assert "gives 3 input channels but the network reads 4 (RGB + noise-level map)" in caplog.text
    assert "--sigma" in caplog.text


def test_sigma_for_a_network_without_a_noise_map_is_refused(tmp_path, monkeypatch, caplog, one_thread):
    monkeypatch.chdir(tmp_path)
    opt = _opt(tmp_path, "videoconvbaseline", "deblur")
    models = tmp_path / "experiments" / "b" / "models"
    models.mkdir(parents=True)
    net = define_network("videoconvbaseline", network_kwargs(tiny_net("videoconvbaseline", "deblur")))
    torch.save({"params": net.state_dict()}, models / "1_G.pth")
    lq, gt = _write_clips(str(tmp_path / "clips"), "deblur", 16)
    code = evaluate.main(["--opt", opt, "--set", "task=b", "--folder_lq", lq, "--folder_gt", gt, "--sigma", "25",
                          "--device", "cpu", "--num_workers", "0", "--save_dir", str(tmp_path / "results")])
    assert code == 2 and not (tmp_path / "results").exists()
    assert "--sigma 25 (which adds a noise-level map) gives 4 input channels but the network reads 3 (RGB)" \
        in caplog.text


@pytest.mark.parametrize("net_type,data_form", [("vrt", "denoise"), ("rvrt", "sr"), ("videoconvbaseline", "sr")])
def test_training_data_that_does_not_fit_the_network_is_one_line(net_type, data_form, tmp_path, monkeypatch,
                                                                 capsys):
    """A 3-channel network on denoising data (RGB + map), a 4-channel denoiser on 3-channel data: the test set is
    refused when it is built, the training set on the first batch its loader delivers (where the loader's timeout
    applies), before any step: one line naming both numbers, and no checkpoint is written."""
    monkeypatch.chdir(tmp_path)
    net_form = "sr" if data_form == "denoise" else "denoise"
    opt = _opt(tmp_path, net_type, data_form)
    with open(opt) as f:
        tree = json.load(f)
    tree["netG"] = tiny_net(net_type, net_form)
    tree["scale"] = 4 if net_form == "sr" else 1
    for d in tree["datasets"].values():
        d["scale"] = tree["scale"] if data_form == "sr" else 1
    channels = (4, 3) if data_form == "denoise" else (3, 4)
    for section, cls in (("test", "SyntheticVideoTestDataset"), ("train", "SyntheticVideoTrainDataset")):
        with open(opt, "w") as f:
            json.dump(tree, f)
        assert main_train_vrt.main(["--opt", opt, "--set", "task=mismatch"]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: datasets.{section} ({cls}) gives {channels[0]} input "
                                                   f"channels but the network reads {channels[1]}"), err
        assert not list((tmp_path / "experiments" / "mismatch").glob("models/*.pth"))
        tree["datasets"].pop("test", None)


def test_check_channels_names_both_numbers():
    io = NetIO(in_chans=4, noise_map=True)
    io.check_channels(4, "x")
    with pytest.raises(InputMismatch, match=r"^clip\.mp4 gives 3 input channels but the network reads 4 \(RGB \+ "
                                            r"noise-level map\); give a noise level"):
        io.check_channels(3, "clip.mp4")
    with pytest.raises(InputMismatch, match="reads no noise-level map"):
        NetIO().check_channels(4, "y")
