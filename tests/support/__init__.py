"""Support code of the test suite: shared builders and option dicts (``helpers``, ``video_helpers``), the golden
fixtures' filler (``golden``), and the entry points of the real processes the tests start (``*_entry.py``,
``*_worker.py``). Nothing here is collected as a test."""
