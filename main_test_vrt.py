"""Test VRT/RVRT: released models (``--task``, flags of the official ``main_test_vrt.py``) or our checkpoints.

    python main_test_vrt.py --task 001_VRT_videosr_bi_REDS_6frames --folder_lq testsets/REDS4/sharp_bicubic \
        --folder_gt testsets/REDS4/GT --tile 40 128 128 --tile_overlap 2 20 20 --save_result
    python main_test_vrt.py --opt options/vrt/000_train_vrt_demo.json --folder_lq clips/ --folder_gt gt/

See ``engine/evaluate.py`` for the logic and docs/evaluation.md for every task's settings.
"""

from __future__ import annotations

import logging
import sys

from engine.evaluate import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    sys.exit(main())
