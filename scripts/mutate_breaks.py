"""The catalogue of deliberate breaks that ``scripts/mutate.py`` runs: per module, plausible mistakes (one exact piece
of code and what replaces it) and the tests that must catch them.

A break is worth listing when it is a mistake someone could make while changing the module (an off-by-one, a
probability ignored, a generator swapped for another, a step left out) and it breaks a promise the module makes. Its
``old`` text must occur exactly once in the module (``scripts/mutate.py`` reports a break whose code moved as STALE).
``tests``: the pytest arguments that guard it (default: the module's entry in :data:`TESTS`); keep them to the tests
that run in seconds to a minute, so a module's breaks run in minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BREAKS", "TESTS", "Break"]


@dataclass(frozen=True)
class Break:
    """One deliberate break: ``old`` (exact text, once in the module) becomes ``new``; ``why``: the promise broken."""

    name: str
    old: str
    new: str
    why: str
    tests: tuple[str, ...] = ()


DEGRADATION_TESTS = ("tests/test_degradations.py",)

TESTS: dict[str, tuple[str, ...]] = {
    "data/degradation_ops.py": DEGRADATION_TESTS,
    "data/degradation_pipeline.py": DEGRADATION_TESTS,
    "data/degradations.py": DEGRADATION_TESTS,
    "data/degradation_codec.py": DEGRADATION_TESTS,
    "data/dataset_video_file_train.py": ("tests/test_degradations.py", "tests/test_video_file_train.py"),
    "engine/resume.py": ("tests/test_resume_notes.py", "tests/test_trainable_units.py"),
    "models/model_gan.py": ("tests/test_model_gan.py",),
    "models/model_base.py": ("tests/test_trainable_units.py", "tests/test_checkpoint.py"),
    "scripts/mutate.py": ("tests/test_mutate.py",),
    "scripts/mutate_breaks.py": ("tests/test_mutate.py",),
}

BREAKS: dict[str, list[Break]] = {
    "data/degradation_ops.py": [
        Break("codec-global-stream", "rate[key] = int(rng.integers(int(lo), int(hi) + 1))",
              "rate[key] = int(np.random.randint(int(lo), int(hi) + 1))",
              "the codec's rate drawn from numpy's global stream instead of the clip's generator (issue 27)"),
        Break("codec-fixed-generator", 'codec = _choose(rng, self.codecs, p["codec_prob"])',
              'codec = _choose(np.random.default_rng(0), self.codecs, p["codec_prob"])',
              "the codec chosen from one fixed generator: every clip gets the same codec"),
        Break("kernel-prob-ignored", 'kind = _choose(rng, self.kinds, p["kernel_prob"])',
              "kind = _choose(rng, self.kinds, None)", "blur kernels drawn with equal weights, not `kernel_prob`"),
        Break("kernel-size-top-never", "size = 2 * int(rng.integers(lo // 2, hi // 2 + 1)) + 1",
              "size = 2 * int(rng.integers(lo // 2, hi // 2)) + 1", "the largest kernel size is never drawn"),
        Break("aniso-is-iso", 'sy, angle = (sx, np.zeros(n)) if kind.endswith("iso") and not kind.endswith("aniso") '
              'else (', 'sy, angle = (sx, np.zeros(n)) if kind.endswith("iso") else (',
              "anisotropic kernels drawn with sigma_y = sigma_x and no rotation"),
        Break("vary-ignored", "if vary <= 0 or frames == 1:", "if True:",
              "`vary` ignored: parameters never drift over the frames"),
        Break("drift-leaves-range", "end = rng.uniform(max(lo, start - reach), min(hi, start + reach))",
              "end = rng.uniform(start - reach, start + reach)", "a drifting parameter may leave its range"),
        Break("direction-prob-ignored", 'direction = _choose(rng, ["up", "down", "keep"], p["direction_prob"])',
              'direction = _choose(rng, ["up", "down", "keep"], None)', "resize directions drawn equally often"),
        Break("up-factor-short", '"up": lambda: rng.uniform(1, hi)', '"up": lambda: rng.uniform(1, (1 + hi) / 2)',
              "up-scaling factors never reach the upper half of the range"),
        Break("relative-to-ignored", 'base = ctx.target if p["relative_to"] == "target" else clip.shape[1:3]',
              "base = clip.shape[1:3]", "`relative_to: target` resizes relative to the input"),
        Break("mode-prob-ignored", 'mode = _choose(rng, self.modes, p["mode_prob"])', "mode = self.modes[0]",
              "the resize mode is always the first one"),
        Break("gray-prob-inverted", 'gray = rng.random() < p["gray_prob"]', 'gray = rng.random() > p["gray_prob"]',
              "grey noise with probability 1 - `gray_prob`"),
        Break("gaussian-prob-inverted", 'gaussian = rng.random() < p["gaussian_prob"]',
              'gaussian = rng.random() >= p["gaussian_prob"]', "Gaussian noise with probability 1 - `gaussian_prob`"),
        Break("jpeg-quality-range-low", 'quality = np.rint(_series(rng, self.params["quality"], clip.shape[0], '
              'float(self.params["vary"])))', 'quality = np.rint(_series(rng, [self.params["quality"][0]] * 2, '
              'clip.shape[0], float(self.params["vary"])))', "JPEG always at the lowest quality of the range"),
        Break("shuffle-fixed-order", "for g in rng.permutation(len(self.children)):",
              "for g in range(len(self.children)):", "`shuffle` always runs its groups in the listed order"),
    ],
    "data/degradation_pipeline.py": [
        Break("prob-inverted", "if op.prob < 1 and rng.random() >= op.prob:",
              "if op.prob < 1 and rng.random() < op.prob:", "an operation runs with probability 1 - `prob`"),
        Break("final-resize-mode-swapped", 'clip = resize_clip(clip, target, "area" if shrink else "bicubic")',
              'clip = resize_clip(clip, target, "bicubic" if shrink else "area")',
              "the final resize to GT/scale shrinks with bicubic (aliasing) and enlarges with area"),
        Break("no-final-clip", "return np.clip(out, 0, 1, out=out)", "return out",
              "the LQ is not clipped to [0, 1] after the operations"),
        Break("preset-weights-kept", "op.pop(weights, None)", "pass",
              "a preset change of `kernel`/`mode`/`codec` keeps the preset's weights (a length mismatch)"),
    ],
    "data/degradations.py": [
        Break("gray-gaussian-per-channel", "noise = rng.standard_normal((t, h, w, 1 if gray else c), "
              "dtype=np.float32)", "noise = rng.standard_normal((t, h, w, c), dtype=np.float32)",
              "grey Gaussian noise differs between the channels"),
        Break("poisson-unscaled", "noise = (rng.poisson(levels) - levels).astype(np.float32)\n    noise *= "
              "(np.asarray(scale, np.float32) / np.float32(255))[:, None, None, None]",
              "noise = (rng.poisson(levels) - levels).astype(np.float32)\n    noise *= np.float32(1 / 255)",
              "Poisson noise ignores its scale"),
        Break("uint8-truncates", "return np.floor(np.clip(clip, 0, 1) * 255 + 0.5).astype(np.uint8)",
              "return np.floor(np.clip(clip, 0, 1) * 255).astype(np.uint8)", "8-bit levels truncated, not rounded"),
    ],
    "data/degradation_codec.py": [
        Break("crf-ignored", 'opts["crf"] = str(int(crf))', 'opts["crf"] = "23"', "the codec's crf is ignored"),
        Break("bitrate-ignored", "stream.bit_rate = int(bitrate)", "pass", "the codec's bitrate is ignored"),
        Break("no-even-padding", "ph, pw = max(h + h % 2, least), max(w + w % 2, least)", "ph, pw = h, w",
              "odd or small frames go to the encoder unpadded"),
    ],
    "data/dataset_video_file_train.py": [
        Break("items-one-generator", "rng = np.random.default_rng(np.random.randint(2**32, dtype=np.uint64))",
              "rng = np.random.default_rng(0)",
              "every item degraded from one fixed generator (issue 27): all items get the same degradation",
              ("tests/test_degradations.py",)),
    ],
    "engine/resume.py": [
        Break("predated-key-not-default", "return values.get(key, spec.default if spec is not None else absent)",
              "return values.get(key, absent)", "a train key a checkpoint predates counts as changed"),
        Break("threads-not-compared", '("threads", "intra-op thread count"), ', "",
              "a change of thread count is not a reason for an inexact resume"),
        Break("global-batch-not-compared", "if saved_global != current_global:", "if False:",
              "a change of the global batch is not a reason for an inexact resume"),
        Break("past-total-allowed", "if step > total:", "if step > total + 1:",
              "a checkpoint one step past total_iter is resumed instead of refused",
              ("tests/test_bad_input.py::test_total_iter_below_saved_step",)),
        Break("legacy-epoch-items-per-rank", 'return int(state.get("batches_in_epoch", 0)) * per_process * '
              'len(state.get("rng") or [None])', 'return int(state.get("batches_in_epoch", 0)) * per_process',
              "an older checkpoint's epoch position counts one rank's items only"),
    ],
    "models/model_gan.py": [
        Break("d-not-frozen-in-g-pass", "self.net_d.requires_grad_(False)", "self.net_d.requires_grad_(True)",
              "G's adversarial loss leaves gradients in D"),
        Break("warmup-off-by-one", "if step <= self.warmup:", "if step < self.warmup:",
              "the last warm-up step already trains D"),
        Break("no-power-iteration", "            self.net_d.power_iteration()\n", "            pass\n",
              "D's spectral-norm vectors are never iterated"),
        Break("g-accum-not-averaged", "self.backward(total / n)", "self.backward(total)",
              "G's accumulated micro-batch losses are summed, not averaged",
              ("tests/test_gan_exactness.py::test_two_gan_processes_with_an_elastic_restart_equal_one_with_accumulation",
               )),
        Break("d-accum-not-averaged", "self.backward((l_real + l_fake) / n)", "self.backward(l_real + l_fake)",
              "D's accumulated micro-batch losses are summed, not averaged"),
        Break("d-init-iters-ignored", "return step % self.d_update_ratio == 0 and step > self.d_init_iters, True",
              "return step % self.d_update_ratio == 0, True", "`D_init_iters` ignored: G trains from the first step"),
    ],
    "models/model_base.py": [
        Break("unit-files-not-written", "        for unit in self.units.values():\n            for label, obj in "
              "unit.checkpoint_files():\n                ckpt.atomic_save(obj, self._path(step, label))\n",
              "", "the units' files are not written (only the state file)"),
        Break("ema-not-restored", 'ckpt.load_network(unit.ema, path, "params_ema", strict=True)', "pass",
              "a resume does not restore the EMA copy"),
        Break("optimizer-not-restored", "                unit.load_optimizer(path)\n            elif",
              "                pass\n            elif", "a resume does not restore a unit's optimizer"),
        Break("lr-not-set-on-resume", "        self.update_learning_rate(step)\n        state = ckpt.safe_load",
              "        state = ckpt.safe_load", "a resume does not set the LR of the step"),
        Break("scaler-never-updated", "        if self.scaler is not None and units:\n            "
              "self.scaler.update()", "        if self.scaler is not None and units:\n            pass",
              "the GradScaler is never updated"),
        Break("pretrained-ema-not-copied", "                else:\n                    unit.update_ema(0.0)\n"
              "            path = paths.get", "            path = paths.get",
              "a pretrained G without pretrained_netE leaves E at its random start"),
    ],
    "scripts/mutate.py": [
        Break("checkout-mutated", "path = os.path.join(scratch, module)", "path = os.path.join(ROOT, module)",
              "breaks are written into the checkout while the tests run in the unbroken copy"),
        Break("survivor-called-killed", 'result = "SURVIVED" if ok else "KILLED"', 'result = "KILLED"',
              "a break the tests miss is reported as killed"),
        Break("ambiguous-break-applied", "if source.count(brk.old) != 1:", "if brk.old not in source:",
              "a break whose code occurs twice is applied (to every occurrence) instead of reported stale"),
    ],
    "scripts/mutate_breaks.py": [  # (the text is split so that it occurs once here: in the break it changes)
        Break("catalogue-stale", "if step > " + "total:", "if step >= " + "total:",
              "a break whose code is no longer in its module"),
    ],
}
