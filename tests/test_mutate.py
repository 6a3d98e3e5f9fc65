"""scripts/mutate.py (deliberate breaks, docs/testing.md): every break of the catalogue still applies to its module,
and a run reports killed, surviving and stale breaks from a scratch copy without touching the checkout."""

from __future__ import annotations

import ast
import os
import subprocess

from scripts import mutate
from scripts.mutate_breaks import BREAKS, TESTS, Break
from tests.support.helpers import ROOT


def test_every_break_of_the_catalogue_applies_once_and_parses():
    for module, breaks in BREAKS.items():
        with open(os.path.join(ROOT, module), encoding="utf-8") as f:
            source = f.read()
        for brk in breaks:
            broken = mutate.apply(source, brk)
            assert broken is not None, (f"{module}: the code of break {brk.name!r} is no longer there exactly once; "
                                        "update scripts/mutate_breaks.py")
            ast.parse(broken, filename=f"{module} ({brk.name})")
        assert len({b.name for b in breaks}) == len(breaks), module
        for target in {t.split("::")[0] for b in breaks for t in (b.tests or TESTS[module])}:
            assert os.path.isfile(os.path.join(ROOT, target)), (module, target)


def test_a_run_kills_reports_survivors_and_stale_breaks_in_a_scratch_copy(tmp_path, monkeypatch):
    (tmp_path / "tests").mkdir()
    (tmp_path / "pkg.py").write_text("def f():\n    return 1  # the answer\n")
    (tmp_path / "tests" / "test_pkg.py").write_text("from pkg import f\n\n\ndef test_f():\n    assert f() == 1\n")
    (tmp_path / ".gitignore").write_text("ignored/\n")
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "big.bin").write_bytes(b"x")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "pkg.py", ".gitignore"], cwd=tmp_path, check=True)  # tests/ untracked: copied too
    assert mutate.project_files(str(tmp_path)) == [".gitignore", "pkg.py", "tests/test_pkg.py"]
    breaks = [Break("wrong-answer", "return 1", "return 2", "f is wrong"),
              Break("comment", "# the answer", "# another comment", "nothing"),
              Break("moved", "return 3", "return 4", "code that is not there"),
              Break("ambiguous", "n", "m", "code that is there twice")]
    monkeypatch.setattr(mutate, "ROOT", str(tmp_path))
    monkeypatch.setitem(BREAKS, "pkg.py", breaks)
    monkeypatch.setitem(TESTS, "pkg.py", ("tests/test_pkg.py",))
    outcomes = mutate.mutate(["pkg.py"], set(), timeout=60, log=lambda line: None)
    assert [(o.brk.name, o.result, o.by) for o in outcomes] == [
        ("wrong-answer", "KILLED", "tests/test_pkg.py::test_f"), ("comment", "SURVIVED", ""), ("moved", "STALE", ""),
        ("ambiguous", "STALE", "")]
    assert (tmp_path / "pkg.py").read_text() == "def f():\n    return 1  # the answer\n"  # the checkout untouched
    table = mutate.markdown(outcomes)
    assert "| `pkg.py` | `comment` | nothing | SURVIVED |  |" in table
