"""Train VRT/RVRT from a KAIR-format option file.

    python main_train_vrt.py --opt options/vrt/000_train_vrt_demo.json [--set train.total_iter=10 ...]
    torchrun --nproc_per_node=8 main_train_vrt.py --opt options/vrt/001_train_vrt_videosr_bi_reds_6frames.json

The distributed mode comes from the launcher's environment (``WORLD_SIZE > 1``); the legacy ``--dist``,
``--launcher`` and ``--local_rank``/``--local-rank`` flags are accepted and ignored. Re-running the same command
resumes from the newest complete checkpoint in ``experiments/<task>/models/``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

if __name__ == "__main__":  # before torch starts its OpenMP runtime, which reads these once (utils/utils_openmp.py)
    from utils.utils_openmp import TRAIN_SETTINGS, choose_wait_policy

    OPENMP_NOTE: str | None = choose_wait_policy(TRAIN_SETTINGS)
else:
    OPENMP_NOTE = None

from engine.options import log_kair_notes, parse_options  # noqa: E402
from engine.resume import ResumeError  # noqa: E402
from engine.train import ConfigError, train  # noqa: E402
from models.model_plain import NonFiniteLossError  # noqa: E402
from utils import utils_dist, utils_numerics, utils_option  # noqa: E402
from utils.utils_checkpoint import CheckpointError  # noqa: E402
from utils.utils_dataloader import BatchSplitError, DataLoaderStallError  # noqa: E402
from utils.utils_logger import FILE_ONLY, setup_logger  # noqa: E402

USER_ERRORS = (utils_option.OptionError, utils_dist.DistError, ConfigError, ResumeError, BatchSplitError,
               CheckpointError, NonFiniteLossError, DataLoaderStallError, FileNotFoundError)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--opt", default="options/vrt/000_train_vrt_demo.json", help="KAIR-format JSON option file")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="override options with dotted keys, e.g. train.total_iter=10 (values parse as JSON)")
    parser.add_argument("--dist", default=None, help="ignored (legacy): distributed mode comes from WORLD_SIZE")
    parser.add_argument("--launcher", default=None, help="ignored (legacy)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help="legacy torch.distributed.launch argument; only fills LOCAL_RANK when it is unset")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    utils_dist.apply_legacy_local_rank(args.local_rank)
    rank = utils_dist.world_info_from_env()[0] if "RANK" in os.environ else 0
    try:
        notes: list[str] = []  # logged once the experiment's log exists (parsing comes first)
        opt = parse_options(args.opt, args.set, notes=notes)
        utils_numerics.prepare_environment(opt["train"]["deterministic"])  # before anything starts cuBLAS
        dist_info = utils_dist.init_dist(opt["dist_backend"], opt["dist_timeout"])
        try:
            rank = dist_info.rank
            setup_logger(None, rank)

            def on_ready() -> None:  # everything is built and loaded: now the experiment folder may change
                setup_logger(os.path.join(opt["path"]["log"], "train.log") if dist_info.is_master else None, rank)
                utils_option.save(opt, sys.argv)
                logging.getLogger(__name__).info("Options:\n%s", utils_option.dict2str(opt), extra=FILE_ONLY)
                log_kair_notes(args.opt, notes)
                if OPENMP_NOTE and dist_info.device.type == "cpu":
                    logging.getLogger(__name__).info("%s", OPENMP_NOTE)

            train(opt, dist_info, on_ready)
        finally:
            utils_dist.destroy_dist()
    except USER_ERRORS as exc:
        prefix = f"[rank {rank}] " if rank else ""
        sys.stderr.write(f"{prefix}error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
