"""``theory-kit figure N``: reproduce figure N of the paper (figN.png + figN.json; with
--quick figN_quick.png + figN_quick.json)."""
from __future__ import annotations

import argparse

from .. import api
from ..api.userdata import default_jobs
from .common import add_executor_args, add_out_arg, add_progress_arg, done_word, run_options

DEFAULT_JOBS = default_jobs()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "figure", help="reproduce a figure of the paper (writes figN.png and figN.json)",
        description="Reproduce figure N of arXiv 2603.03993 with this toolkit. Prints a "
                    "reference estimate of the run time first (for an idle 2-core reference "
                    "machine, not measured on this one); a stopped run resumes when started "
                    "again with the same options.")
    p.add_argument("number", type=int, metavar="N", help="figure number, 1 to 14")
    p.add_argument("--quick", action="store_true",
                   help="fewer runs/samples and smaller D: under a minute, same layout; "
                        "writes figN_quick.json and figN_quick.png")
    add_out_arg(p, "figN.json and figN.png, or figN_quick.* with --quick (a .json name must "
                   "then be that file's)", default="figures")
    add_progress_arg(p)
    add_executor_args(p, DEFAULT_JOBS, "independent pieces (default: the number of cores, "
                                       "capped at 4)")
    p.add_argument("--data", metavar="FILE.npz",
                   help="figures 5 and 7: your own images, an .npz with an 'images' array of "
                        "shape (n, h, w) or (n, d) (optional integer 'labels'); default: the "
                        "UCI digits from scikit-learn (pip install -e '.[digits]')")
    p.add_argument("--redraw", action="store_true",
                   help="only redraw figN.png from an existing figN.json (with --quick: "
                        "figN_quick.*)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = api.figure(args.number, quick=args.quick, out=args.out, data=args.data,
                        redraw=args.redraw, run=run_options(args), log=print)
    done = "wrote" if args.redraw else done_word(result)
    for path in result.files:
        print(f"{done} {path}")
    return 0
