"""The documentation's example runner (docs/run_examples.py) and the README's shape."""

import importlib.util
import os
import re
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("run_examples",
                                              os.path.join(ROOT, "docs", "run_examples.py"))
run_examples = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_examples)

PAGE = '''# A page

```python
print("one rank")
```

```python norun
import a_module_nobody_has
```

```python requires=a_module_nobody_has,os
print("never")
```

````markdown
```python
print("inside a four-backtick fence: not an example")
```
````

```{toctree}
index
```

```text
$ not code
```

```bash
echo "$((6 * 7))" > answer && test "$(cat answer)" = 42
```

```python timeout=30
# mpiexec -n 2 python this.py
from mpi4py import MPI
assert MPI.COMM_WORLD.size == 2
```
'''


def test_blocks_languages_options_and_ranks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    blocks = run_examples.blocks(str(page))
    assert [(b.language, b.line) for b in blocks] == [
        ("python", 3), ("python", 7), ("python", 11), ("bash", 29), ("python", 33)]
    assert blocks[1].options == {"norun": True}
    assert blocks[2].options == {"requires": "a_module_nobody_has,os"}
    assert run_examples._missing(blocks[2]) == ["a_module_nobody_has"]
    assert [b.ranks for b in blocks] == [1, 1, 1, 1, 2]
    assert blocks[4].options == {"timeout": "30"}


def test_a_torchrun_block_names_its_workers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\n# torchrun --nproc-per-node 3 this.py\nimport torch\n```\n"
                    "```python\n# mpiexec -n 2 python this.py\n```\n")
    torchrun, mpi = run_examples.blocks(str(page))
    assert (torchrun.ranks, torchrun.torchrun) == (3, True)
    assert (mpi.ranks, mpi.torchrun) == (2, False)
    assert run_examples.command(torchrun, str(tmp_path), "mpiexec")[1:3] == \
        ["--nproc-per-node", "3"]


def test_runs_what_is_runnable_and_counts(tmp_path, capsys):
    if shutil.which("mpiexec", path=os.path.dirname(sys.executable)) is None:
        pytest.skip("no mpiexec beside this Python (pip install mpich)")
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    assert run_examples.main([str(page)]) == 0
    out = capsys.readouterr().out
    assert "5 examples in 1 files: 3 run (2 python, 1 shell; 1 under mpiexec, " \
           "0 under torchrun), 1 marked norun, 1 skipped for a missing module" in out
    assert out.rstrip().endswith("examples: 3 passed, 0 failed, 2 skipped")


def test_a_failing_example_fails_the_run(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text("```python\nprint('before')\nraise SystemExit('the example broke')\n```\n"
                    "```bash\ntrue\n```\n")
    assert run_examples.main([str(page)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "the example broke" in out and "page.md:1" in out
    assert "examples: 1 passed, 1 failed, 0 skipped" in out
    page.write_text("```python norun\nx\n```\n")
    assert run_examples.main([str(page)]) == 1           # nothing ran: a failure too


def test_a_hanging_example_times_out(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text("```python timeout=2\nimport time\ntime.sleep(60)\n```\n")
    assert run_examples.main([str(page)]) == 1
    assert "timed out after 2 s" in capsys.readouterr().out


def test_default_files_are_the_readme_and_the_pages():
    files = [os.path.relpath(f, ROOT) for f in run_examples.default_files()]
    assert files[0] == "README.md"
    assert os.path.join("docs", "quickstart.md") in files
    assert not any(f.startswith(os.path.join("docs", "_build")) for f in files)


def test_readme_is_short_and_its_quick_start_runs_at_4_ranks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert text.count("\n") <= 200
    blocks = run_examples.blocks(os.path.join(ROOT, "README.md"))
    quick = [b for b in blocks if b.language == "python"]
    assert len(quick) == 1 and quick[0].ranks == 4 and not quick[0].options
    assert len(quick[0].text.strip().splitlines()) <= 20
    # the two set-up commands, exactly as the CI entry point and the main job know them
    assert "bash scripts/bench.sh     # main job: install, then the benchmark on 8 ranks " \
           "(mpiexec -n 8)" in text
    assert "bash scripts/test.sh      # install, then all tests: serial, tests/mpi " \
           "under four MPIs, torchrun" in text
    assert re.search(r"pip install \"mpiredist\[mpich\]\"", text)
