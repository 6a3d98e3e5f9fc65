"""Test VRT/RVRT: released models (``--task``, flags of the official ``main_test_vrt.py``) or our checkpoints.

    python main_test_vrt.py --task 001_VRT_videosr_bi_REDS_6frames --folder_lq testsets/REDS4/sharp_bicubic \
        --folder_gt testsets/REDS4/GT --tile 40 128 128 --tile_overlap 2 20 20 --save_result
    python main_test_vrt.py --opt options/vrt/000_train_vrt_demo.json --folder_lq clips/ --folder_gt gt/

See ``engine/evaluate.py`` for the logic and docs/evaluation.md for every task's settings.
"""

from __future__ import annotations

import logging
import sys

if __name__ == "__main__":  # before torch starts its OpenMP runtime, which reads these once (utils/utils_openmp.py)
    from utils.utils_openmp import EVAL_SETTINGS, choose_wait_policy

    OPENMP_NOTE = choose_wait_policy(EVAL_SETTINGS)

from engine.evaluate import main  # noqa: E402

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    logging.getLogger(__name__).debug("%s", OPENMP_NOTE)
    sys.exit(main())
