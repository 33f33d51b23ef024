"""``theory-kit figure N``: reproduce figure N of the paper (figN.png + figN.json; with
--quick figN_quick.png + figN_quick.json); ``theory-kit figure all``: every figure, through one
set of workers, with a summary (gallery.json)."""
from __future__ import annotations

import argparse

from .. import api
from ..api.userdata import default_jobs
from ..figures.paper import ALL
from ..model.validation import ValidationError
from .common import add_executor_args, add_out_arg, add_progress_arg, done_word, run_options

DEFAULT_JOBS = default_jobs()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "figure", help="reproduce a figure of the paper, or all of them (writes figN.png and "
                       "figN.json)",
        description="Reproduce figure N of arXiv 2603.03993 with this toolkit, or every figure "
                    "with 'all'. Prints a reference estimate of the run time first (for an idle "
                    "2-core reference machine, not measured on this one); a stopped run resumes "
                    "when started again with the same options. 'all' makes the figures through "
                    "one set of workers, shows one progress bar, prints each figure's CPU and "
                    "wall time at the end and writes gallery.json (gallery_quick.json).")
    p.add_argument("number", metavar="N", help="figure number, 1 to 14, or all")
    p.add_argument("--quick", action="store_true",
                   help="fewer runs/samples and smaller D: under a minute, same layout; "
                        "writes figN_quick.json and figN_quick.png")
    add_out_arg(p, "figN.json and figN.png, or figN_quick.* with --quick (a .json name must "
                   "then be that file's; with all, a folder)", default="figures")
    add_progress_arg(p)
    add_executor_args(p, DEFAULT_JOBS, "independent pieces (default: the number of cores, "
                                       "capped at 4)")
    p.add_argument("--data", metavar="FILE.npz",
                   help="figures 5 and 7: your own images, an .npz with an 'images' array of "
                        "shape (n, h, w) or (n, d) (optional integer 'labels'); default: the "
                        "UCI digits from scikit-learn (pip install -e '.[digits]')")
    p.add_argument("--redraw", action="store_true",
                   help="only redraw figN.png from an existing figN.json (with --quick: "
                        "figN_quick.*; with all: every figure's)")
    p.add_argument("--only", metavar="N,N,...",
                   help="with all: make only these figures, e.g. 1,8 (default: 1 to 14)")
    p.set_defaults(func=run)


def figure_number(text: str) -> int | None:
    """The figure number as given (the API checks its range), or None for ``all``.

    >>> figure_number("all"), figure_number("8")
    (None, 8)
    """
    if text == ALL:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValidationError(f"figure: must be a figure number 1..14 or all (got {text!r})") \
            from None


def only_list(text: str | None) -> list[int] | None:
    """The figures of ``--only`` (comma-separated numbers), or None.

    >>> only_list("1,8"), only_list(None)
    ([1, 8], None)
    """
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValidationError(f"only: must be comma-separated figure numbers such as 1,8 "
                              f"(got {text!r})") from None


def run(args: argparse.Namespace) -> int:
    number = figure_number(args.number)
    only = only_list(args.only)
    if only is not None and number is not None:
        raise ValidationError(f"only: only with figure all (got figure {number})")
    if number is None:
        every = api.figure("all", quick=args.quick, out=args.out, data=args.data,
                           redraw=args.redraw, run=run_options(args), log=print, figures=only)
        if args.redraw:
            for path in every.files:
                if path.endswith(".png"):
                    print(f"wrote {path}")
        elif every.summary_file is not None:
            print(f"{done_word(every)} {every.summary_file}")
        return 0
    result = api.figure(number, quick=args.quick, out=args.out, data=args.data,
                        redraw=args.redraw, run=run_options(args), log=print)
    done = "wrote" if args.redraw else done_word(result)
    for path in result.files:
        print(f"{done} {path}")
    return 0
