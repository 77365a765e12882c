"""Run every code example of the README and the documentation pages.

    python docs/run_examples.py                 # README.md and docs/**/*.md
    python docs/run_examples.py docs/quickstart.md --list

Fenced blocks whose language is ``python`` (or ``py``) or a shell
(``bash``, ``sh``, ``shell``) are examples, and every one runs unless its
fence says otherwise; other blocks (``text``, ``toml``, MyST directives) are
not code to run.  What a block may say, after the language on its fence
(MyST and GitHub show only the language)::

    ```python norun          shown, not run (say why in the text around it)
    ```python requires=torch run only where ``import torch`` works; else skipped
    ```python timeout=300    seconds before the run is killed (default --timeout)

The API reference's pages show the docstrings of ``mpiredist.__all__``;
their ``>>>`` examples run too, as doctests of the modules that define
those names (one Python process, no MPI; ``# doctest: +SKIP`` marks the
ones that need ranks), unless ``--no-docstrings``.

A Python block runs under ``mpiexec -n N python -m mpi4py`` when its first
line is a comment naming the launch, ``# mpiexec -n N ...`` (or
``mpirun``), under ``torchrun --nproc-per-node N`` (this Python's, no MPI)
when it names that, ``# torchrun --nproc-per-node N ...``, and as plain
``python`` otherwise; ``-m mpi4py`` ends the whole
job when one rank raises.  Shell blocks run with ``bash -e -o pipefail``.
Each block runs alone, in a fresh temporary folder, with this Python's
folder first on ``PATH`` (its ``python`` and ``mpiexec``: the venv's PyPI
MPICH).  The count of examples run, not run and skipped is printed last as
``examples: N passed, N failed, N skipped``; the exit status is 1 if any
example failed or none ran.
"""

import argparse
import dataclasses
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = ("python", "py", "python3")
SHELL = ("bash", "sh", "shell")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
LAUNCH = re.compile(r"^#\s*(?:mpiexec|mpirun)\s+(?:\S+\s+)*?-n\s+(?P<n>\d+)\b")
TORCHRUN = re.compile(r"^#\s*torchrun\s+(?:\S+\s+)*?--nproc[-_]per[-_]node[ =](?P<n>\d+)\b")
# generated or vendored pages: no examples of ours
SKIP_DIRS = ("_build", "_generated", os.path.join("api", "generated"))


@dataclasses.dataclass
class Block:
    """One fenced example: where it is, its language, options and text."""

    path: str
    line: int
    language: str
    options: dict
    text: str

    @property
    def where(self):
        return f"{os.path.relpath(self.path, ROOT)}:{self.line}"

    @property
    def ranks(self):
        """Ranks of a Python block: ``# mpiexec -n N`` (or ``# torchrun
        --nproc-per-node N``) on its first line, else 1."""
        m = LAUNCH.match(self._first) or TORCHRUN.match(self._first)
        return int(m.group("n")) if m else 1

    @property
    def torchrun(self):
        """True when the block's first line names torchrun as its launcher."""
        return bool(TORCHRUN.match(self._first))

    @property
    def _first(self):
        return self.text.lstrip("\n").split("\n", 1)[0].strip()


def default_files():
    """README.md and every Markdown page under docs/ but generated ones."""
    files = [os.path.join(ROOT, "README.md")]
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)):
        rel = os.path.relpath(path, os.path.join(ROOT, "docs"))
        if not rel.startswith(SKIP_DIRS):
            files.append(path)
    return files


def _options(words):
    out = {}
    for w in words:
        key, _, value = w.partition("=")
        out[key] = value if value else True
    return out


def blocks(path):
    """The fenced code blocks of a Markdown file, in order (Python and shell only)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip()
        body, j = [], i + 1
        while j < len(lines):
            close = FENCE.match(lines[j])
            if (close and close.group("fence")[0] == fence[0]
                    and len(close.group("fence")) >= len(fence) and not close.group("info").strip()):
                break
            body.append(lines[j])
            j += 1
        words = info.split()
        if words and not info.startswith("{"):
            language = words[0].lower()
            if language in PYTHON + SHELL:
                found.append(Block(path, i + 1, language, _options(words[1:]),
                                   "\n".join(body) + "\n"))
        i = j + 1
    return found


def _missing(block):
    """Modules the block ``requires=`` that cannot be imported here."""
    wanted = block.options.get("requires")
    if not wanted or wanted is True:
        return []
    return [m for m in wanted.split(",") if importlib.util.find_spec(m) is None]


def _environment(ranks):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # the research harnesses (python -m benchmarks.X) live beside the package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if ranks > (os.cpu_count() or 1):
        # MPICH busy-polls otherwise (scripts/common.sh: mpi_oversubscription_env)
        env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    return env


def command(block, folder, mpiexec):
    """The command line that runs ``block`` from a file written into ``folder``."""
    if block.language in SHELL:
        path = os.path.join(folder, "example.sh")
        with open(path, "w", encoding="utf-8") as f:
            f.write(block.text)
        return ["bash", "-e", "-o", "pipefail", path]
    path = os.path.join(folder, "example.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(block.text)
    if block.torchrun:
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        return [torchrun, "--nproc-per-node", str(block.ranks), "--monitor-interval", "0.1",
                path]
    if block.ranks == 1:
        return [sys.executable, path]
    return [mpiexec, "-n", str(block.ranks), sys.executable, "-m", "mpi4py", path]


def run(block, mpiexec, timeout):
    """Run one block; return ``(ok, seconds, output)``."""
    limit = int(block.options.get("timeout", timeout))
    folder = tempfile.mkdtemp(prefix="mpiredist-example-")
    t0 = time.perf_counter()
    try:
        done = subprocess.run(command(block, folder, mpiexec), cwd=folder,
                              env=_environment(block.ranks if block.language in PYTHON else 1),
                              capture_output=True, text=True, timeout=limit,
                              stdin=subprocess.DEVNULL)
        ok, output = done.returncode == 0, done.stdout + done.stderr
        if not ok:
            output += f"\n(exit status {done.returncode})"
    except subprocess.TimeoutExpired as exc:
        ok = False
        output = f"timed out after {limit} s\n" + "".join(
            (s.decode(errors="replace") if isinstance(s, bytes) else s or "")
            for s in (exc.stdout, exc.stderr))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return ok, time.perf_counter() - t0, output


DOCTESTS = r"""
import doctest, importlib, inspect, sys
import mpiredist
modules = sorted({o.__name__ if inspect.ismodule(o) else o.__module__
                  for o in (getattr(mpiredist, n) for n in mpiredist.__all__)})
flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
attempted = failed = 0
for name in modules:
    result = doctest.testmod(importlib.import_module(name), optionflags=flags)
    attempted += result.attempted
    failed += result.failed
print(f"doctests: {attempted} attempted, {failed} failed in {len(modules)} modules")
sys.exit(1 if failed else 0)
"""


def docstring_examples(timeout):
    """Run the doctests of the modules behind ``mpiredist.__all__``.

    Returns ``(attempted, failed, output)``.
    """
    try:
        done = subprocess.run([sys.executable, "-c", DOCTESTS], capture_output=True,
                              text=True, timeout=timeout, env=_environment(1), cwd=ROOT)
    except subprocess.TimeoutExpired:
        return 0, 1, f"doctests timed out after {timeout} s"
    m = re.search(r"doctests: (\d+) attempted, (\d+) failed", done.stdout)
    if m is None:
        return 0, 1, done.stdout + done.stderr
    attempted, failed = int(m.group(1)), int(m.group(2))
    return attempted, max(failed, int(done.returncode != 0)), done.stdout + done.stderr


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help="Markdown files (default: README.md "
                        "and docs/**/*.md)")
    parser.add_argument("--mpiexec", default=shutil.which("mpiexec", path=os.path.dirname(
        sys.executable)) or "mpiexec", help="the launcher (default: this venv's mpiexec)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per example")
    parser.add_argument("--list", action="store_true", help="list the examples, run none")
    parser.add_argument("--no-docstrings", action="store_true", help="do not run the "
                        "doctests of the API reference's docstrings")
    args = parser.parse_args(argv)
    files = [os.path.abspath(f) for f in args.files] or default_files()
    found = [b for f in files for b in blocks(f)]
    passed, failed, norun, skipped = [], [], [], []
    for b in found:
        kind = (f"python, {b.ranks} rank{'s' * (b.ranks > 1)}" if b.language in PYTHON
                else "shell")
        if b.options.get("norun"):
            norun.append(b)
            print(f"not run  {b.where}  ({kind}, marked norun)")
            continue
        missing = _missing(b)
        if missing:
            skipped.append(b)
            print(f"skipped  {b.where}  ({kind}; needs {', '.join(missing)})")
            continue
        if args.list:
            print(f"example  {b.where}  ({kind})")
            continue
        ok, seconds, output = run(b, args.mpiexec, args.timeout)
        print(f"{'ok' if ok else 'FAILED':7}  {b.where}  ({kind}, {seconds:.1f} s)", flush=True)
        (passed if ok else failed).append(b)
        if not ok:
            print("\n".join("    | " + line for line in output.rstrip().splitlines()[-40:]))
    doc_passed = doc_failed = 0
    if not args.list and not args.no_docstrings and not args.files:
        attempted, doc_failed, output = docstring_examples(args.timeout)
        doc_passed = attempted - doc_failed
        print(f"{'ok' if not doc_failed else 'FAILED':7}  docstrings of mpiredist.__all__ "
              f"(doctest: {attempted} examples, {doc_failed} failed)")
        if doc_failed:
            print("\n".join("    | " + line for line in output.rstrip().splitlines()[-40:]))
    ran = [b for b in passed + failed]
    by_language = {}
    for b in ran:
        key = "python" if b.language in PYTHON else "shell"
        by_language[key] = by_language.get(key, 0) + 1
    print(f"{len(found)} examples in {len(files)} files: {len(ran)} run ("
          + ", ".join(f"{n} {k}" for k, n in sorted(by_language.items()))
          + f"; {sum(b.ranks > 1 and not b.torchrun for b in ran if b.language in PYTHON)}"
          + f" under mpiexec, {sum(b.torchrun for b in ran if b.language in PYTHON)}"
          + " under torchrun), "
          f"{len(norun)} marked norun, {len(skipped)} skipped for a missing module")
    if failed:
        print("failed: " + ", ".join(b.where for b in failed))
    if doc_passed or doc_failed:
        print(f"and {doc_passed + doc_failed} docstring examples of the API reference "
              f"(doctest): {doc_failed} failed")
    print(f"examples: {len(passed) + doc_passed} passed, {len(failed) + doc_failed} failed, "
          f"{len(norun) + len(skipped)} skipped")
    if args.list:
        return 0
    return 1 if failed or doc_failed or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
