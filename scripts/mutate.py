"""Run named deliberate breaks of a module against the tests that guard it, and say which breaks the tests miss.

A break replaces one exact piece of a module's code with a plausible mistake (``scripts/mutate_breaks.py`` lists
them, each with the promise it breaks). For each break this script writes it into a scratch copy of the working
tree (the files git tracks or would track; the checkout itself is never written to), runs the break's tests there
with ``pytest -x``, and reports:

- ``KILLED``: a test failed (the first failing test is named);
- ``SURVIVED``: every test passed, a blind spot: add a test that fails on the break, or record in
  ``benchmarks/RESULTS.md`` why the break does not matter;
- ``STALE``: the code to replace is no longer in the module exactly once; update the catalogue.

Before any break, the same tests run on the unbroken copy and must pass. Bytecode is not written (a break and its
restore can share a second and a size, which would let Python load a stale ``.pyc``). Run it under the CPU lock on a
shared machine; a module's breaks take from seconds (killed early) to one run of its tests each (survivors)::

    python scripts/mutate.py --list                                   # every break, by module
    python scripts/mutate.py data/degradation_ops.py                  # the breaks of one module (or several)
    python scripts/mutate.py data/degradation_ops.py --only codec-global-stream
    python scripts/mutate.py data/degradation_ops.py --only vary-ignored --tests tests/test_degradations.py::test_x
    python scripts/mutate.py --all --markdown /tmp/survivors.md       # a table for RESULTS.md

The exit status is 0 when every break was killed, 1 when one survived or was stale, 2 when the unbroken tests fail.
docs/testing.md says how to add a break.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from scripts.mutate_breaks import BREAKS, TESTS, Break  # noqa: E402 (the project root goes on the path first)

_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
_RUNNING = re.compile(r'File "[^"]*/(tests/test_\w+\.py)", line \d+ in (test_\w+)')


@dataclass
class Outcome:
    """What one break did: ``KILLED`` (by ``by``), ``SURVIVED`` or ``STALE``; ``seconds`` of pytest."""

    module: str
    brk: Break
    result: str
    by: str
    seconds: float


def project_files(root: str) -> list[str]:
    """The files of the working tree that git tracks or would track (not ignored), relative to ``root``."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout
    return sorted({p for p in out.decode().split("\0") if p and os.path.isfile(os.path.join(root, p))})


def copy_tree(root: str, dest: str) -> None:
    """Copy the project's files (:func:`project_files`) from ``root`` to ``dest``."""
    for rel in project_files(root):
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(root, rel), target)


def apply(source: str, brk: Break) -> str | None:
    """``source`` with ``brk`` applied, or ``None`` when its code is not in ``source`` exactly once."""
    if source.count(brk.old) != 1:
        return None
    return source.replace(brk.old, brk.new)


def run_tests(where: str, tests: tuple[str, ...], timeout: float) -> tuple[bool, str, float]:
    """``(passed, first failing test or '', seconds)`` of ``pytest -x -q tests`` in ``where``."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", *tests]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timeout after {timeout:g} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if proc.returncode == 0:
        return True, "", seconds
    found = _FAILED.search(proc.stdout)
    if found:
        return False, found.group(1), seconds
    if proc.returncode < 0:  # a crash (a heap corruption in a codec library): name the test that was running
        test = _RUNNING.findall(proc.stdout + proc.stderr)
        return False, f"crashed (signal {-proc.returncode}){' in ' + '::'.join(test[-1]) if test else ''}", seconds
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["(no output)"]
    return False, f"pytest exit {proc.returncode}: {tail[0][:200]}", seconds


def mutate(modules: list[str], only: set[str], timeout: float, tests: tuple[str, ...] = (),
           log: Callable[[str], None] = print) -> list[Outcome]:
    """Run the breaks of ``modules`` (only those named in ``only``, when given) in a scratch copy of the tree, each
    against its own tests, or against ``tests`` when given."""
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="mutate-") as scratch:
        copy_tree(ROOT, scratch)
        for module in modules:
            breaks = [b for b in BREAKS[module] if not only or b.name in only]
            if not breaks:
                continue
            path = os.path.join(scratch, module)
            with open(path, encoding="utf-8") as f:
                original = f.read()
            baseline = tests or tuple(dict.fromkeys(t for b in breaks for t in (b.tests or TESTS[module])))
            ok, failed, seconds = run_tests(scratch, baseline, timeout)
            if not ok:
                log(f"{module}: the unbroken tests fail ({failed}); no break was run")
                raise SystemExit(2)
            log(f"{module}: unbroken tests pass ({seconds:.0f} s: {' '.join(baseline)})")
            for brk in breaks:
                broken = apply(original, brk)
                if broken is None:
                    outcomes.append(Outcome(module, brk, "STALE", "", 0.0))
                    log(f"  STALE     {brk.name}: its code is not in {module} exactly once")
                    continue
                with open(path, "w", encoding="utf-8") as f:
                    f.write(broken)
                try:
                    ok, failed, seconds = run_tests(scratch, tests or brk.tests or TESTS[module], timeout)
                finally:
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(original)
                result = "SURVIVED" if ok else "KILLED"
                outcomes.append(Outcome(module, brk, result, failed, seconds))
                log(f"  {result:<9} {brk.name} ({seconds:.0f} s){': ' + failed if failed else ''}")
    return outcomes


def markdown(outcomes: list[Outcome]) -> str:
    """A table of the outcomes: module, break, what it breaks, result, the test that caught it."""
    rows = ["| module | break | what it breaks | result | caught by |", "|---|---|---|---|---|"]
    for o in outcomes:
        rows.append(f"| `{o.module}` | `{o.brk.name}` | {o.brk.why} | {o.result} | "
                    f"{f'`{o.by}`' if o.by else ''} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="module paths, e.g. data/degradation_ops.py")
    parser.add_argument("--all", action="store_true", help="every module of the catalogue")
    parser.add_argument("--only", action="append", default=[], help="a break's name (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the breaks and exit")
    parser.add_argument("--tests", nargs="+", help="pytest arguments to run instead of the breaks' own tests "
                        "(e.g. one test: tests/test_x.py::test_y)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per pytest run (default 600)")
    parser.add_argument("--markdown", help="also write the outcomes as a Markdown table to this file")
    args = parser.parse_args(argv)
    modules = list(BREAKS) if args.all or (args.list and not args.modules) else args.modules
    unknown = [m for m in modules if m not in BREAKS]
    if unknown or not modules:
        parser.error(f"no breaks for {', '.join(unknown) or 'no module'}; modules: {', '.join(BREAKS)}")
    names = {b.name for m in modules for b in BREAKS[m]}
    if set(args.only) - names:
        parser.error(f"unknown break(s) {', '.join(sorted(set(args.only) - names))} in {', '.join(modules)}")
    if args.list:
        for module in modules:
            print(f"{module}  (tests: {' '.join(TESTS[module])})")
            for brk in BREAKS[module]:
                print(f"  {brk.name:<28} {brk.why}")
        return 0
    outcomes = mutate(modules, set(args.only), args.timeout, tests=tuple(args.tests or ()))
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(outcomes))
    killed = sum(o.result == "KILLED" for o in outcomes)
    print(f"{killed} of {len(outcomes)} breaks killed")
    return 0 if killed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
