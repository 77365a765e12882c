"""``python -m mpiredist``: subcommand registry, ``plan`` output and errors."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mpiredist as mr
from mpiredist import cli

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--mesh", "x=2,y=4", "--shape", "4096,4096", "--src", "[{x,y},{}]",
        "--dst", "[{},{x,y}]"]
PLAN_KEYS = {"strategy", "steps", "src_local_bytes", "dst_local_bytes",
             "peak_local_bytes", "bytes_sent_per_rank", "lower_bound_bytes_per_rank"}
STEP_KEYS = {"op", "axes", "dims", "local_shape_before", "local_shape_after",
             "bytes_sent_per_rank"}


def _run(*argv, block_mpi=True):
    """Run ``python -m mpiredist`` in a fresh interpreter where mpi4py cannot import."""
    code = ("import sys, runpy\n"
            + ("sys.modules['mpi4py'] = None\n" if block_mpi else "")
            + "sys.argv = ['mpiredist'] + sys.argv[1:]\n"
            "try:\n"
            "    runpy.run_module('mpiredist', run_name='__main__', alter_sys=True)\n"
            "finally:\n"
            "    assert 'mpi4py' not in sys.modules or sys.modules['mpi4py'] is None\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def test_help_lists_subcommands():
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    for name in cli.COMMANDS:
        assert name in out.stdout
    assert {"plan", "calibrate"} <= set(cli.COMMANDS)


def test_plan_help_documents_every_flag():
    out = _run("plan", "--help")
    assert out.returncode == 0
    for flag in ("--mesh", "--shape", "--src", "--dst", "--dtype", "--strategy", "--json",
                 "collectives", "replicate", "direct"):
        assert flag in out.stdout


def test_plan_prints_explain_without_mpi():
    out = _run("plan", *ARGS)
    assert out.returncode == 0, out.stderr
    want = mr.plan((4096, 4096), "float32", {"x": 2, "y": 4}, "[{x,y},{}]", "[{},{x,y}]")
    assert out.stdout.strip() == want.explain().strip()
    assert out.stderr == ""


@pytest.mark.parametrize("strategy", ["collectives", "replicate", "direct"])
def test_plan_json(capsys, strategy):
    assert cli.main(["plan", *ARGS, "--dtype", "float64", "--json",
                     "--strategy", strategy]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert PLAN_KEYS <= set(doc)
    assert doc["strategy"] == strategy and doc["dtype"] == "float64"
    assert doc["src_local_bytes"] == 512 * 4096 * 8
    for step in doc["steps"]:
        assert STEP_KEYS <= set(step)
    assert doc["bytes_sent_per_rank"] == sum(s["bytes_sent_per_rank"] for s in doc["steps"])


@pytest.mark.parametrize("flag, value, culprit", [
    ("--mesh", "x=2,y=four", "'y'"),
    ("--mesh", "x=2,x=4", "'x'"),
    ("--mesh", "x=0,y=4", "'x'"),
    ("--shape", "4096,abc", "4096,abc"),
    ("--shape", "4096,-1", "negative"),
    ("--shape", "4096", "dimension"),
    ("--src", "[{x,y}", "[{x,y}"),
    ("--src", "[{x,x},{}]", "'x'"),
    ("--dst", "[{},{z}]", "'z'"),
    ("--dst", "[{},{}] sum{x}", "partial"),
    ("--dtype", "float33", "float33"),
])
def test_bad_input_is_one_line_exit_2(capsys, flag, value, culprit):
    argv = ["plan", *ARGS, flag, value]
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpiredist plan: error: ")
    assert culprit in lines[0]


def test_plan_for_nodes_shows_the_bytes_across_them_and_a_view(capsys, tmp_path,
                                                               monkeypatch):
    """--ranks-per-node plans for nodes of R devices; with a profile that has
    across-node rates, an all-gather whose major digit crosses runs on the
    view that splits dim 0 at the node boundary."""
    import dataclasses

    from mpiredist.planning import profile as profiles
    argv = ["plan", "--mesh", "x=8", "--shape", "64,32", "--src", "[{x},{}]",
            "--dst", "[{},{}]", "--json", "--ranks-per-node", "4"]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inter_node_bytes_per_rank"] == 4 * doc["inter_node_lower_bound_bytes_per_rank"]
    assert doc["view_shape"] is None
    slow = dataclasses.replace(profiles.DEFAULT, beta_across=tuple(
        (op, 1, profiles.BETA / 20) for op in profiles.OPS))
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(slow.to_dict()))
    monkeypatch.setenv(profiles.ENV, str(path))
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["view_shape"] == [2, 32, 32]
    assert doc["inter_node_bytes_per_rank"] == doc["inter_node_lower_bound_bytes_per_rank"]
    assert cli.main(argv[:-1] + ["3"]) == 2
    assert "does not divide" in capsys.readouterr().err


def test_bad_input_in_a_fresh_process():
    out = _run("plan", *ARGS, "--src", "[{w},{}]")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "'w'" in out.stderr


def test_the_bench_models_what_the_model_command_did(tmp_path, capsys):
    """The plan-only table lives in the bench (``--plan-only``), not in the CLI."""
    from mpiredist.bench.__main__ import main
    path = tmp_path / "rows.json"
    assert main(["--plan-only", "--cases", "c04", "--strategies", "collectives,xla",
                 "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [r["strategy"] for r in rows] == ["collectives", "xla"]
    assert rows[1]["bytes_sent_per_rank"] == 12582912
    assert "model" not in cli.COMMANDS


def _absolute(node):
    """The module an import node names, as ``mpiredist.x.y``."""
    base = "mpiredist" if node.level else ""
    return ".".join(p for p in (base, node.module or "") if p)


def test_cli_imports_nothing_of_the_bench():
    tree = ast.parse(Path(cli.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("mpiredist.bench"), alias.name
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node)
            assert not module.startswith("mpiredist.bench"), module
            assert not (module == "mpiredist" and "bench" in [a.name for a in node.names])


def test_plan_between_meshes_without_mpi(capsys):
    out = _run("plan", "--mesh", "x=4", "--ranks", "0-3", "--dst-mesh", "a=2",
               "--dst-ranks", "6,7", "--shape", "10,10", "--src", "[{x},{}]", "--dst", "[{},{a}]")
    assert out.returncode == 0, out.stderr
    assert "x=4@0-3" in out.stdout and "a=2@6,7" in out.stdout and "8 ranks" in out.stdout
    # every rank of the target gets 10 x 5 float32 = 200 B, all from other ranks
    assert cli.main(["plan", "--mesh", "x=4", "--ranks", "0-3", "--dst-mesh", "a=2",
                     "--dst-ranks", "6,7", "--shape", "10,10", "--src", "[{x},{}]",
                     "--dst", "[{},{a}]", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bytes_total"] == 400 and doc["bytes_received_max"] == 200
    # nesting meshes over the same ranks: one refined mesh, the collective plan
    assert cli.main(["plan", "--mesh", "x=8", "--dst-mesh", "a=2,b=4", "--shape", "16,16",
                     "--src", "[{x},{}]", "--dst", "[{b},{a}]", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mesh"] == "_r0=2,_r1=4" and doc["steps"]


@pytest.mark.parametrize("flags", [["--ranks", "0,0,1,2"], ["--ranks", "0-2"]])
def test_plan_bad_ranks_exit_2(capsys, flags):
    rc = cli.main(["plan", "--mesh", "x=4", *flags, "--shape", "8", "--src", "[{x}]",
                   "--dst", "[{}]", "--dst-mesh", "a=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "ranks" in err
