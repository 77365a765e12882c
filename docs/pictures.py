"""The documentation's pictures, drawn by mpiredist itself.

``conf.py`` calls :func:`write_all` at every build (into ``docs/_generated``,
not committed): each layout picture is ``python -m mpiredist plan ... --draw``
of one plan (:func:`mpiredist.draw.draw_plan`), the benchmark picture is
``python -m mpiredist.bench --from-json docs/_data/<run>.json --plot`` of the
recorded run.  The README's picture must exist without a build, so it is
committed: ``python docs/pictures.py --readme`` redraws
``docs/_static/redistribution.png``.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (shape, mesh, src, dst): each drawn as plan --draw draws it
PLANS = {
    "rows-to-columns": ((8, 8), {"x": 2, "y": 2}, "[{x,y}, {}]", "[{}, {x,y}]"),
    "readme": ((4096, 4096), {"x": 2, "y": 4}, "[{x,y}, {}]", "[{}, {x,y}]"),
    "grid-transpose": ((8, 8), {"x": 2, "y": 4}, "[{x}, {y}]", "[{y}, {x}]"),
    "replicate-y": ((8, 8), {"x": 2, "y": 4}, "[{x}, {}]", "[{x}, {y}]"),
    "uneven": ((10, 6), {"x": 4}, "[{x}, {}]", "[{}, {x}]"),
    "partial-sums": ((8, 8), {"x": 2, "y": 2}, "[{x}, {}] sum{y}", "[{x}, {y}]"),
    "pencils-3d": ((8, 8, 8), {"a": 2, "b": 2}, "[{a}, {b}, {}]", "[{}, {a}, {b}]"),
}
README = ("readme", "redistribution.png")
BENCH_RUN = os.path.join(HERE, "_data", "run-quick-8ranks.json")


def draw(name, path):
    """Draw the plan ``PLANS[name]`` into ``path``."""
    import mpiredist as mr
    from mpiredist.draw import draw_plan

    shape, axes, src, dst = PLANS[name]
    draw_plan(mr.plan(shape, "float32", mr.Mesh(axes), src, dst), path)


def write_all(out):
    """Write every picture of the guide into the folder ``out``; return their paths."""
    from mpiredist.bench import report

    os.makedirs(out, exist_ok=True)
    paths = []
    for name in PLANS:
        if name == README[0]:
            continue
        paths.append(os.path.join(out, f"plan-{name}.png"))
        draw(name, paths[-1])
    paths.append(os.path.join(out, "bench-quick-8ranks.png"))
    report.plot(report.read_json(BENCH_RUN)["records"], paths[-1])
    return paths


if __name__ == "__main__":
    if sys.argv[1:] != ["--readme"]:
        sys.exit("usage: python docs/pictures.py --readme")
    draw(README[0], os.path.join(HERE, "_static", README[1]))
