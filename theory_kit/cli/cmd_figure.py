"""``theory-kit figure N``: reproduce figure N of the paper (figN.png + figN.json)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..figures import runner
from ..model.validation import check_int, fail
from ..io.limits import check_figure
from .common import add_executor_args, add_out_arg, add_progress_arg, out_json, request_of, stamp_output, stored_output, sweep_executor

# the budget of a full figure (15 min) assumes both cores of a 2-core machine are used
DEFAULT_JOBS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                          else (os.cpu_count() or 1)))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "figure", help="reproduce a figure of the paper (writes figN.png and figN.json)",
        description="Reproduce figure N of arXiv 2603.03993 with this toolkit. Prints an "
                    "estimate of the run time first; a stopped run resumes when started "
                    "again with the same options.")
    p.add_argument("number", type=int, metavar="N", help="figure number, 1 to 14")
    p.add_argument("--quick", action="store_true",
                   help="fewer runs/samples and smaller D: under a minute, same layout")
    add_out_arg(p, "figN.json and figN.png (a .json name must then be figN.json)",
                default="figures")
    add_progress_arg(p)
    add_executor_args(p, DEFAULT_JOBS, "independent pieces (default: the number of cores, "
                                       "capped at 4)")
    p.add_argument("--data", metavar="FILE.npz",
                   help="figures 5 and 7: your own images, an .npz with an 'images' array of "
                        "shape (n, h, w) or (n, d) (optional integer 'labels'); default: the "
                        "UCI digits from scikit-learn (pip install -e '.[digits]')")
    p.add_argument("--redraw", action="store_true",
                   help="only redraw figN.png from an existing figN.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    number = runner.check_number(args.number)
    folder = output_folder(args.out, number)
    if args.redraw:
        print(f"wrote {runner.redraw(number, folder)}")
        return 0
    png, js = runner.output_paths(folder, number)
    request = request_of(args, files=("data",))
    if png.is_file() and stored_output(js, request) is not None:
        print(f"kept (already computed by the same command) {png}\n"
              f"kept (already computed by the same command) {js}")
        return 0
    jobs = check_int(args.jobs, "jobs", 1)
    check_figure(float(runner.figure_module(number).estimate_seconds(args.quick)), number,
                 args.quick, jobs)
    with sweep_executor(args) as executor:
        written = runner.run_figure(number, quick=args.quick, out=folder, jobs=args.jobs,
                                     data=args.data, executor=executor)
    stamp_output(js, request)
    for path in written:
        print(f"wrote {path}")
    return 0


def output_folder(out: str, number: int) -> Path:
    """The folder of figN.json/figN.png that ``--out`` names (a folder, or .../figN.json)."""
    js = out_json(out, f"fig{number}.json")
    if js.name != f"fig{number}.json":
        fail("out", f"figure {number} writes fig{number}.json and fig{number}.png: give a folder "
             f"or a path ending in fig{number}.json", out)
    return js.parent
