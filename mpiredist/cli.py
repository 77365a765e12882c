"""Command line: ``python -m mpiredist SUBCOMMAND ...`` (each with ``--help``).

Subcommands register themselves in :data:`COMMANDS` with :func:`command`;
each gets its own argument parser and runs without MPI.  Bad input (a
malformed mesh, layout, shape or dtype) prints one line on stderr and exits
with status 2, as argparse does for bad flags.
"""

import argparse
import re
import sys

from .core.errors import MpiredistError, ShapeError

__all__ = ["COMMANDS", "command", "main", "parse_shape"]

COMMANDS = {}

STRATEGY_HELP = ("collectives: the paper's normal form (memory bound proven); "
                 "replicate: all-gather then slice (XLA's fallback); "
                 "direct: one point-to-point exchange")


def command(name, help):
    """Register ``(add_arguments, run)`` under ``name``: a decorator of a class."""
    def register(cls):
        COMMANDS[name] = (help, cls)
        return cls
    return register


_LENGTH = re.compile(r"[+-]?[0-9]+\Z")


def parse_shape(text):
    """``"4096,4096"`` -> ``(4096, 4096)``; :class:`ShapeError` on anything else.

    Lengths are ASCII decimal integers from 0 to ``sys.maxsize`` (numpy's
    largest index).
    """
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    if not all(_LENGTH.match(p) for p in parts):
        raise ShapeError(f"shape {text!r}: expected comma-separated non-negative "
                         "integers, e.g. 4096,4096")
    # compare the digits before converting: int() of thousands of them is refused
    if any(len(p.lstrip("+-").lstrip("0")) > len(str(sys.maxsize)) or int(p) > sys.maxsize
           for p in parts):
        raise ShapeError(f"shape {text!r} has a length past {sys.maxsize}, numpy's "
                         "largest index")
    shape = tuple(int(p) for p in parts)
    if any(n < 0 for n in shape):
        raise ShapeError(f"shape {text!r} has a negative length")
    return shape


def _positive_int(text):
    """argparse type of a count: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {text!r}")
    return value


def _add_case_flags(parser, required):
    parser.add_argument("--mesh", required=required, metavar="AXES",
                        help="mesh axes in order, NAME=SIZE comma-separated, "
                             "e.g. x=2,y=4 (row-major, last axis fastest)")
    parser.add_argument("--shape", required=required, metavar="N,N,...",
                        help="global array shape, e.g. 4096,4096")
    parser.add_argument("--src", required=required, metavar="LAYOUT",
                        help="source layout, e.g. '[{x,y},{}]' (one {axes} per dim, "
                             "major to minor; optional ' sum{z}' for partial sums)")
    parser.add_argument("--dst", required=required, metavar="LAYOUT",
                        help="target layout, same form as --src")


@command("plan", help="plan a redistribution and print its steps (no MPI)")
class PlanCommand:
    """Print the plan of one redistribution (``plan.explain()`` or JSON)."""

    @staticmethod
    def add_arguments(parser):
        _add_case_flags(parser, required=True)
        parser.add_argument("--dtype", default="float32",
                            help="element type, any numpy dtype name (default float32)")
        from .planning.planner import STRATEGIES
        parser.add_argument("--strategy", default="collectives", choices=STRATEGIES,
                            help=STRATEGY_HELP + " (default collectives)")
        parser.add_argument("--json", action="store_true",
                            help="print the plan as one JSON object (docs/guide/plans.md)")
        parser.add_argument("--dst-mesh", metavar="AXES",
                            help="mesh of the target layout (default --mesh), e.g. a=2,b=4")
        parser.add_argument("--ranks", metavar="LIST",
                            help="ranks of the source mesh, e.g. 0-3 or 0,2,4,6 "
                                 "(default all, in order)")
        parser.add_argument("--dst-ranks", metavar="LIST",
                            help="ranks of the target mesh (default all, in order)")
        parser.add_argument("--ranks-per-node", type=_positive_int, metavar="R",
                            help="plan for nodes of R devices, device d on node d // R "
                                 "(mr.Topology.uniform): every step's bytes across nodes "
                                 "and their lower bound; a profile with across-node "
                                 "rates (MPIREDIST_PROFILE, from calibrate on two or more "
                                 "nodes) also prices them (plans on one mesh, or on two "
                                 "whose axes nest; between others it orders "
                                 "--dst-ranks auto)")
        parser.add_argument("--draw", metavar="FILE.png",
                            help="also draw the source and target layouts (which rank "
                                 "holds which block) and the steps into FILE.png "
                                 "(needs matplotlib: the bench extra)")

    @staticmethod
    def run(args):
        from .core.errors import MeshError
        from .core.mesh import Mesh
        from .core.topology import Topology
        from .planning.planner import plan
        mesh = Mesh(args.mesh, ranks=args.ranks)
        dst_mesh = None
        if args.dst_mesh or args.dst_ranks:
            dst_mesh = Mesh(args.dst_mesh or args.mesh, ranks=args.dst_ranks)
        topology = None
        if args.ranks_per_node is not None:
            from .planning.crossmesh import comm_size_of
            per = args.ranks_per_node
            meshes = [m for m in (mesh, dst_mesh) if m is not None]
            size = max([comm_size_of(*[m for m in meshes if not m.auto])]
                       + [m.size for m in meshes])
            if size % per:
                raise MeshError(f"--ranks-per-node {per} does not divide the {size} ranks "
                                f"of mesh {mesh}" + ("" if dst_mesh is None else
                                                     f" and mesh {dst_mesh}"))
            topology = Topology.uniform(size // per, per)
        p = plan(parse_shape(args.shape), args.dtype, mesh, args.src, args.dst,
                 strategy=args.strategy, dst_mesh=dst_mesh, topology=topology)
        # default=str: the dtype is a numpy dtype object in Plan.to_dict.
        print(p.to_json(indent=2, default=str) if args.json else p.explain())
        if args.draw:
            from .draw import draw_plan
            try:
                draw_plan(p, args.draw)
            except (ImportError, OSError) as exc:
                raise MpiredistError(f"--draw {args.draw}: {exc}") from None
            print(f"drew the plan into {args.draw}", file=sys.stderr)
        return 0


@command("calibrate", help="measure this machine's profile for the planner (run under MPI)")
class CalibrateCommand:
    """Measure latency, bandwidth per collective and group size, packing and
    datatype rates; write the JSON profile the planner ranks plans by.  Run it
    under mpiexec, e.g. 'mpiexec -n 8 python -m mpiredist calibrate'."""

    @staticmethod
    def add_arguments(parser):
        from .planning.profile import default_path
        _calibrate().calibrate_arguments(parser, default_path())

    @staticmethod
    def run(args):
        return _calibrate().calibrate_run(args)


def _calibrate():
    """The runtime's calibration (:mod:`mpiredist.runtime.calibrate`), imported when
    the command runs: it uses MPI, which ``python -m mpiredist`` imports only
    then (a dynamic import, as the package root's, so that no static import
    path from the CLI leads to mpi4py)."""
    import importlib
    return importlib.import_module("mpiredist.runtime.calibrate")


def build_parser():
    """The top-level parser with one subparser per registered command."""
    parser = argparse.ArgumentParser(
        prog="python -m mpiredist",
        description="Plan and model redistributions of distributed arrays "
                    "(arXiv 2112.01075).  The MPI benchmark is "
                    "'mpirun -n 8 python -m mpiredist.bench'.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help, cls) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=(cls.__doc__ or help).strip())
        cls.add_arguments(p)
        p.set_defaults(run=cls.run)
    return parser


def main(argv=None):
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except MpiredistError as exc:
        print(f"mpiredist {args.command}: error: {exc}", file=sys.stderr)
        return 2
