"""Meshes, layouts, planning and ``python -m mpiredist plan`` work where mpi4py cannot
import (docs/architecture.md), and none of them tries to import it.

Each check runs a fresh interpreter whose first statement makes mpi4py
unimportable (``sys.modules['mpi4py'] = None``: ``import mpi4py`` then raises
ImportError), so an import anywhere below fails loudly instead of passing on
a machine that happens to have MPI.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = "import sys\nsys.modules['mpi4py'] = None   # import mpi4py -> ImportError\n"
UNTOUCHED = ("assert sys.modules.get('mpi4py', None) is None, "
             "'mpi4py was imported'\n")
PLAN_KEYS = {"strategy", "steps", "src_local_bytes", "dst_local_bytes",
             "peak_local_bytes", "bytes_sent_per_rank", "lower_bound_bytes_per_rank"}
STEP_KEYS = {"op", "axes", "dims", "local_shape_before", "local_shape_after",
             "bytes_sent_per_rank"}


def _python(code, *argv):
    """Run ``code`` after the mpi4py block in a fresh interpreter; the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code), *argv],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def test_the_block_works():
    done = _python("""
        try:
            import mpi4py
        except ImportError:
            print("blocked")
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "blocked"


def test_mesh_layout_and_plan_without_mpi4py():
    done = _python("""
        import mpiredist as mr
        mesh = mr.Mesh({"x": 2, "y": 4})
        src = mr.Layout.parse("[{x,y}, {}]")
        dst = mr.Layout.parse("[{}, {x,y}]")
        assert mr.Layout.parse(str(src)) == src and eval(repr(dst), vars(mr)) == dst
        p = mr.plan((64, 64), "float32", mesh, src, dst)
        assert isinstance(p, mr.Plan) and p.steps
        assert p.peak_local_bytes <= max(p.src_local_bytes, p.dst_local_bytes)
        print(p.explain())
        """ + UNTOUCHED)
    assert done.returncode == 0, done.stderr
    assert "all_to_all" in done.stdout


def test_every_core_and_planning_module_imports_without_mpi4py():
    done = _python("""
        import importlib, pkgutil
        import mpiredist.core, mpiredist.planning
        names = []
        for pkg in (mpiredist.core, mpiredist.planning):
            for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
                importlib.import_module(info.name)
                names.append(info.name)
        print(" ".join(names))
        """ + UNTOUCHED)
    assert done.returncode == 0, done.stderr
    names = done.stdout.split()
    assert "mpiredist.core.mesh" in names and "mpiredist.planning.planner" in names
    assert "mpiredist.planning.simulate" in names


def test_cli_plan_json_without_mpi4py():
    done = _python("import runpy\n"
                   "sys.argv = ['mpiredist'] + sys.argv[1:]\n"
                   "try:\n"
                   "    runpy.run_module('mpiredist', run_name='__main__', alter_sys=True)\n"
                   "finally:\n"
                   "    " + UNTOUCHED,
                   "plan", "--mesh", "x=2,y=4", "--shape", "64,64", "--src", "[{x,y},{}]",
                   "--dst", "[{},{x,y}]", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert PLAN_KEYS <= set(doc)
    assert doc["steps"] and all(STEP_KEYS <= set(step) for step in doc["steps"])
    assert doc["peak_local_bytes"] <= max(doc["src_local_bytes"], doc["dst_local_bytes"])
    assert doc["src_local_bytes"] == doc["dst_local_bytes"] == 64 * 64 * 4 // 8
