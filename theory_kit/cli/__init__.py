"""Command line: ``theory-kit <verb> ...``.

Each verb lives in its own module ``theory_kit.cli.cmd_<verb>`` exposing
``register(subparsers)``; modules are discovered automatically.

One guard around every verb turns expected failures into one stderr line and a documented
exit status (no traceback unless ``--debug``, anywhere on the command line, or
``THEORY_KIT_DEBUG=1``):

* 0 success; 2 bad input, including unreadable or malformed input files;
* 3 an output cannot be written (path, permission, disk full, a lock held by another run;
  a closed pipe such as ``| head`` exits 3 quietly);
* 4 resources: the request exceeds ``--max-memory`` or a time bound;
* 1 anything else: one line and "rerun with --debug for the traceback";
* 130 interrupted (Ctrl-C), also during start-up.
"""
from __future__ import annotations

import difflib
import errno
import os
import re
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import argparse

EXIT_INPUT, EXIT_OUTPUT, EXIT_RESOURCES, EXIT_INTERNAL, EXIT_INTERRUPT = 2, 3, 4, 1, 130
# OS errors that mean "the output cannot be written" wherever they happen
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG, errno.EFBIG}


def _verb_parser_class():
    import argparse

    class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
        """Every option's default, "(required)" on required options, and nothing for an
        option whose absence its help explains (default None)."""

        def _get_help_string(self, action: argparse.Action) -> str | None:
            text = action.help or ""
            if action.required:
                return text + " (required)"
            if action.default is None:
                return text
            return super()._get_help_string(action)

    class VerbParser(argparse.ArgumentParser):
        """A verb's parser: --help lists every option's default and marks required ones."""

        def __init__(self, *args, **kwargs) -> None:
            kwargs["formatter_class"] = HelpFormatter
            super().__init__(*args, **kwargs)
            # argparse takes only -1 or -.5 for a value, so `--nu -1,2` failed with "expected
            # one argument" instead of naming nu's range; no option of a verb starts with a
            # digit or a dot, so a token that does is a value (lists, exponents, -inf, -nan).
            self._negative_number_matcher = _NUMBER_LIKE
    return VerbParser


_NUMBER_LIKE = re.compile(r"^-(\d|\.\d|(inf|nan)(,|$))", re.IGNORECASE)

# verbs registered by a module other than ``cmd_<verb>`` (``-`` read as ``_``)
_VERB_MODULES = {"bayes-error": "cmd_error"}


def _command_modules() -> list[str]:
    """The ``cmd_*`` modules of this package (found without importing them)."""
    import pkgutil
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("cmd_"))


def build_parser(verb: str | None = None):
    """The argparse parser with every ``cmd_*`` verb registered.

    With ``verb``, only the module that registers it is imported (each verb's module pulls
    in what it runs: SymPy, SciPy, numba, matplotlib; the whole set costs ~3 CPU s per
    process): the parse of a command line of that verb is the same.  An unknown ``verb``, or
    one that its module does not register, gets every verb (an error naming the choices)."""
    import argparse
    import importlib

    from .. import __version__

    _VerbParser = _verb_parser_class()
    parser = argparse.ArgumentParser(
        prog="theory-kit",
        description="Theory of multi-head attention in the single-location model "
                    "(arXiv 2603.03993): errors, ODEs, simulations, figures.",
        epilog="Exit status: 0 ok, 2 bad input, 3 output cannot be written, 4 resources "
               "exceeded, 1 internal error, 130 interrupted.")
    parser.add_argument("--version", action="version", version=f"theory-kit {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of any error "
                             "(also anywhere after the verb)")
    parser.add_argument("--max-memory", metavar="SIZE",
                        help="refuse runs estimated to need more memory (8G, 512M, 30%%; "
                             "default 50%% of RAM, at most what ulimit -v leaves; also "
                             "anywhere after the verb)")
    parser.add_argument("--yes", action="store_true",
                        help="run requests estimated to take over an hour (also after the verb)")
    # every verb's --help shows its defaults
    sub = parser.add_subparsers(dest="command", required=True, metavar="VERB",
                                parser_class=_VerbParser)
    modules = _command_modules()
    if verb is not None:
        own = _VERB_MODULES.get(verb, "cmd_" + verb.replace("-", "_"))
        if own in modules:
            importlib.import_module(f"{__name__}.{own}").register(sub)
            if verb in sub.choices:
                return parser
            return build_parser()
    for name in modules:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def _say(command: str, message: str) -> None:
    print(f"theory-kit {command}: error: {' '.join(str(message).split())}", file=sys.stderr)


def _under(filename: object, out: object) -> bool:
    """Whether an OS error's file is the output (or inside or next to it)."""
    if not filename or not out:
        return False
    try:
        f, o = Path(str(filename)).absolute(), Path(str(out)).absolute()
    except (OSError, ValueError):
        return False
    return f == o or o in f.parents or f.parent == o.parent and f.name.startswith(f".{o.name}")


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the final flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def classify(exc: BaseException, out: object = None) -> tuple[int, str | None]:
    """(exit status, message or None for silence) of an exception escaping a verb."""
    from ..model.validation import OutputError, ResourceError, ValidationError

    if isinstance(exc, ValidationError):
        return EXIT_INPUT, str(exc)
    if isinstance(exc, OutputError):
        return EXIT_OUTPUT, str(exc)
    if isinstance(exc, BrokenPipeError):
        return EXIT_OUTPUT, None
    if isinstance(exc, ResourceError):
        return EXIT_RESOURCES, str(exc)
    if isinstance(exc, MemoryError):
        return EXIT_RESOURCES, ("out of memory; reduce the sizes (samples, D, L, H, F) or the "
                                "number of jobs")
    if isinstance(exc, OSError) and exc.errno is None:
        # raised by the toolkit with its own message (e.g. "data: no such file: ...")
        return (EXIT_INPUT if isinstance(exc, (FileNotFoundError, IsADirectoryError,
                                               PermissionError)) else EXIT_OUTPUT), str(exc)
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        name = f"{exc.filename}: " if exc.filename else ""
        if exc.errno in _OUTPUT_ERRNOS or _under(exc.filename, out):
            return EXIT_OUTPUT, f"out: cannot write {name}{what}"
        if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError,
                            PermissionError)):
            return EXIT_INPUT, f"file: cannot read {name}{what}"
        return EXIT_OUTPUT, f"I/O error: {name}{what}"
    if isinstance(exc, OverflowError):  # Python float arithmetic on a huge input number
        return EXIT_INPUT, ("input: a number overflowed float64 during the computation "
                            f"({exc}); an input such as --gamma, --eta, --T or a matrix entry "
                            "is too large")
    if isinstance(exc, UnicodeDecodeError):
        return EXIT_INPUT, f"file: an input file is not UTF-8 text ({exc.reason})"
    return EXIT_INTERNAL, (f"internal error: {type(exc).__name__}: {exc}"[:400]
                           + "; rerun with --debug for the traceback")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``theory-kit`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("THEORY_KIT_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    yes = "--yes" in argv
    argv = [a for a in argv if a != "--yes"]
    argv, max_memory = _take_option(argv, "--max-memory")
    command = argv[0] if argv and not argv[0].startswith("-") else "error"
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            from ..io.limits import Limits
            limits = Limits(max_memory=max_memory, allow_long=yes)
        except Exception as exc:  # noqa: BLE001 — a bad --max-memory
            return _report(exc, command, None, debug)
        return _main(argv, command, debug, limits)


def _take_option(argv: list[str], name: str) -> tuple[list[str], str | None]:
    """Remove ``name VALUE`` / ``name=VALUE`` from anywhere in argv; (rest, VALUE or None).

    Global options (--max-memory, like --debug and --yes) may follow the verb."""
    rest, value, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == name and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith(name + "="):
            value = arg[len(name) + 1:]
        else:
            rest.append(arg)
        i += 1
    return rest, value


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one stderr line, without the source line Python adds."""
    print(f"theory-kit: warning: {' '.join(str(message).split())}", file=sys.stderr)


def _main(argv: list[str], command: str, debug: bool, limits: object) -> int:
    try:
        parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
        args = _parse(parser, argv)
        args.limits = limits   # the global --max-memory and --yes, for the verb's Run
        command = args.command
        return _run(args, debug)
    except KeyboardInterrupt:
        print(f"theory-kit {command}: interrupted; finished work is saved, "
              "run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPT
    except SystemExit:
        raise  # argparse: --help, --version, usage errors (exit 2 with its own line)
    except BaseException as exc:  # noqa: BLE001 — the one top-level guard
        return _report(exc, command, None, debug)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The parsed command line.  An option the verb does not know is refused with the
    verb's usage (argparse hands a sub-command's leftovers to the top-level parser, whose
    usage lists only the verbs), and the nearest option it has ("did you mean --quick?")."""
    import argparse
    args, extras = parser.parse_known_args(argv)
    if not extras:
        return args
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = str(getattr(args, "command", ""))
    own = verbs.choices.get(command)
    if own is None or not argv or argv[0] != command:   # an option before the verb
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    # compared without the dashes, which every option shares ("--quik" is not near "--nu")
    options = {o.lstrip("-"): o for action in own._actions for o in action.option_strings}
    hints = [options[m] for e in extras if e.startswith("--")
             for m in difflib.get_close_matches(e.split("=", 1)[0].lstrip("-"), list(options),
                                                n=1, cutoff=0.7)]
    hint = f"; did you mean {' or '.join(dict.fromkeys(hints))}?" if hints else ""
    own.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
    raise AssertionError  # unreachable: error() exits


def _report(exc: BaseException, command: str, out: object, debug: bool) -> int:
    """Print the one line for ``exc`` (and the traceback with --debug); its exit status."""
    status, message = classify(exc, out=out)
    if debug:
        import traceback
        traceback.print_exc()
    if isinstance(exc, BrokenPipeError):
        _silence_stdout()
    if message is not None:
        _say(command, message)
    return status


def _run(args, debug: bool) -> int:
    """Run the verb under the output lock, mapping its failures (see :func:`classify`)."""
    from ..io.results import OutputLock
    from .common import run_verb

    out = getattr(args, "out", None)
    try:
        if out is None:
            status = run_verb(args)
        else:
            with OutputLock(out):
                status = run_verb(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the guard
        return status
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001
        return _report(exc, args.command, out, debug)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
