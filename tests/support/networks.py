"""The tiny configurations of every registered network in every task form it supports (for the tests that take
each network through an entry point: tests/test_registered_networks.py, tests/test_export.py)."""

from __future__ import annotations

# the smallest netG of each registered network that runs on 36x36 LQ frames (IART: 64x64), x4
TINY_NETS = {
    "vrt": {"net_type": "vrt", "upscale": 4, "img_size": [2, 40, 40], "window_size": [2, 4, 4], "depths": [1] * 8,
            "indep_reconsts": [], "embed_dims": [8] * 8, "num_heads": [1] * 8, "pa_frames": 2,
            "deformable_groups": 1, "spynet_path": None},
    "rvrt": {"net_type": "rvrt", "upscale": 4, "clip_size": 2, "window_size": [2, 4, 4], "num_blocks": [1, 1, 1],
             "depths": [1, 1, 1], "embed_dims": [8, 8, 8], "num_heads": [1, 1, 1], "deformable_groups": 2,
             "attention_heads": 2, "spynet_path": None},
    "videoconvbaseline": {"net_type": "videoconvbaseline", "upscale": 4, "num_feat": 8, "num_block": 1},
    "basicvsrpp": {"net_type": "basicvsrpp", "mid_channels": 8, "num_blocks": 1, "spynet_path": None},
    "iart": {"net_type": "iart", "mid_channels": 8, "embed_dim": 8, "depths": [1], "num_heads": [2],
             "window_size": [3, 4, 4], "use_checkpoint": False, "drop_path_rate": 0.0, "spynet_path": None},
}

# netG changes from TINY_NETS for each task form a network supports, and the LQ size the form runs on
FORMS: dict[str, dict[str, dict]] = {
    "vrt": {"sr": {}, "denoise": {"upscale": 1, "nonblind_denoising": True}, "deblur": {"upscale": 1},
            "vfi": {"upscale": 1, "pa_frames": 0, "img_size": [4, 40, 40]}},
    "rvrt": {"sr": {}, "denoise": {"upscale": 1, "nonblind_denoising": True}, "deblur": {"upscale": 1}},
    "videoconvbaseline": {"sr": {}, "denoise": {"upscale": 1, "in_chans": 4}, "deblur": {"upscale": 1}},
    "basicvsrpp": {"sr": {}, "deblur": {"is_low_res_input": False}},
    "iart": {"sr": {}},
}
LQ_SIZE = {"rvrt": {"denoise": 136, "deblur": 136},  # RVRT without upscaling needs frames of 132+ pixels
           "basicvsrpp": {"deblur": 132},  # so does BasicVSR++ (multiples of 4)
           "iart": {"sr": 64}}  # IART takes LQ frames of 64+ pixels (its NetIO.min_size)
CASES = [(net, form) for net in sorted(FORMS) for form in FORMS[net]]


def lq_size(net_type: str, form: str) -> int:
    return LQ_SIZE.get(net_type, {}).get(form, 36)


def tiny_net(net_type: str, form: str = "sr") -> dict:
    """The tiny ``netG`` of a network in one task form."""
    return {**TINY_NETS[net_type], **FORMS[net_type][form]}
