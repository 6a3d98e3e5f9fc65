"""docs/options.md is generated from the option schema and must match it (docs never drift from the code)."""

from __future__ import annotations

from scripts import gen_options_doc
from utils.utils_option_schema import SCHEMA


def test_options_reference_is_up_to_date():
    assert gen_options_doc.main(["--check"]) == 0, "run: python scripts/gen_options_doc.py"


def test_every_option_has_a_doc_and_every_documented_default_is_valid():
    from utils.utils_option import check_value
    from utils.utils_option_schema import OPTIONAL, REQUIRED

    for key, opt in SCHEMA.items():
        assert opt.doc.strip(), key
        if opt.default not in (OPTIONAL, REQUIRED) and not isinstance(opt.default, dict):
            check_value(key, opt.default, opt)


def test_the_check_fails_when_the_file_differs(tmp_path, monkeypatch):
    stale = tmp_path / "options.md"
    stale.write_text("# old\n")
    monkeypatch.setattr(gen_options_doc, "OUT", stale)
    assert gen_options_doc.main(["--check"]) == 1
