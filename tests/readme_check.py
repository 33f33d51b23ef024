"""Run the shell commands of the README and of the documentation pages, and check the outputs
they claim.

The README and the docs (``docs/**/*.md``, the Sphinx site's Markdown pages) are part of the
product: every command in a ```bash block must run as written from the repository root of a
fresh clone, and every output shown must be what the command prints now.  The pages are checked
in one fresh copy, README first, then the docs pages in reading order (:data:`DOC_PAGES`); a
command that appears again (the README's short examples are the docs' worked examples) runs
once, and every claim made for it anywhere is checked against that output.

Conventions of the README that this module relies on (stated in the README itself):

* a command is a line of a ```bash block (with ``\\`` continuations joined); text after ``  #`` on
  a command line is a remark;
* a line ``# …`` directly after a command (or a plain ``` block right after the bash block) is a
  *claimed output*: it must match the command's output, where ``...`` matches anything, numbers
  must agree to the digits shown, and error estimates (after ``+/-``, ``±`` or an ``abs_err`` key)
  must agree within a factor of 10 (they depend on the machine's rounding and sampling);
* a ```python block is run as one script with the project's Python (its ``#`` remarks are
  not claims);
* install and test commands (``python3 -m venv …``, ``pip install …``, ``pytest``) are what CI
  itself runs, so they are checked by CI, not here.

``python tests/readme_check.py`` runs every command (quick variants of the figures unless
``--full``) and prints a report; the test suite calls :func:`check_all`.
"""
from __future__ import annotations

import math
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# the docs pages whose commands run first, in this order (the reading order of the site); every
# other Markdown page of docs/ follows in path order
DOCS_FIRST = ("getting_started.md", "user_guide/conventions.md", "user_guide/01_task_activation.md",
              "user_guide/02_derive.md", "user_guide/03_errors.md", "user_guide/04_ode.md",
              "user_guide/05_simulate.md", "user_guide/06_einf.md", "user_guide/07_escape.md",
              "user_guide/08_compare.md", "user_guide/09_sweeps.md", "gallery.md")
DOCS_SKIP = ("_build", "api/generated", "jupyter_execute")
NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
ERROR_MARKERS = ("+/-", "±", '"abs_err":', "abs_err", "spread")
# commands CI runs itself (install, the test run): checked there, never recursively here
CI_COMMANDS = re.compile(r"(python3 -m venv|pip install|pytest)")
# commands cheap enough for the default test run (seconds each); the slow run takes them all
CHEAP = re.compile(r"^theory-kit (error|bayes-error|derive|drift)\b")


@dataclass
class Command:
    """One README command, the outputs claimed for it, and where it stands in the README."""

    line: int
    text: str
    claims: list[str] = field(default_factory=list)
    page: str = "README.md"

    def quick(self) -> str:
        """The quick variant: full figure runs become ``--quick`` runs (same code path)."""
        parts = []
        for piece in re.split(r"(\s*&&\s*)", self.text):
            if re.match(r"\s*theory-kit figure \d+", piece) and "--quick" not in piece \
                    and "--redraw" not in piece:
                piece = piece.rstrip() + " --quick"
            parts.append(piece)
        return "".join(parts)


def _strip_remark(line: str) -> str:
    match = re.search(r"\s{2,}#\s", line)
    return line[:match.start()] if match else line


def doc_pages() -> list[Path]:
    """The Markdown pages of the docs, in the order their commands are checked."""
    found = [p for p in sorted(DOCS.rglob("*.md"))
             if not any(part in p.relative_to(DOCS).as_posix() for part in DOCS_SKIP)]
    first = [DOCS / name for name in DOCS_FIRST if (DOCS / name) in found]
    return first + [p for p in found if p not in first]


def page_commands(path: Path) -> list[Command]:
    """The checkable commands of one page (its ```bash lines, then its ```python blocks)."""
    text = path.read_text()
    commands = checkable(parse_readme(text)) + python_blocks(text)
    for cmd in commands:
        cmd.page = path.relative_to(ROOT).as_posix()
    return commands


def all_commands(pages: list[Path] | None = None) -> list[Command]:
    """The commands of the README, then of every docs page (or of ``pages``), in order."""
    return [c for p in (pages if pages is not None else [README, *doc_pages()])
            for c in page_commands(p)]


def python_blocks(text: str) -> list[Command]:
    """Every ```python block as one command (``python -c``)."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i + 2, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            script = "\n".join(body)
            out.append(Command(start, f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}"))
        i += 1
    return out


def parse_readme(text: str) -> list[Command]:
    """Commands of every ```bash block, with the claimed outputs that follow them."""
    lines = text.splitlines()
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        i += 1
        last: Command | None = None
        while i < len(lines) and lines[i].strip() != "```":
            raw = lines[i]
            if raw.lstrip().startswith("#"):
                if last is not None:
                    last.claims.append(raw.lstrip()[1:].strip())
                i += 1
                continue
            start, body = i + 1, _strip_remark(raw).rstrip()
            while body.endswith("\\") and i + 1 < len(lines):
                i += 1
                body = body[:-1].rstrip() + " " + _strip_remark(lines[i]).strip()
            if body.strip():
                last = Command(start, body.strip())
                commands.append(last)
            i += 1
        i += 1
        # a plain ``` block right after a bash block shows the last command's output
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        if last is not None and j < len(lines) and lines[j].strip() == "```":
            j += 1
            while j < len(lines) and lines[j].strip() != "```":
                if lines[j].strip():
                    last.claims.append(lines[j].strip().lstrip("#").strip())
                j += 1
            i = j + 1
    return commands


def _claim_pattern(claim: str) -> tuple[re.Pattern, list[tuple[str, bool]]]:
    """A regex for a claim, and its numbers (text, is_error_estimate) in order."""
    pattern, numbers, pos = "", [], 0
    tokens = re.finditer(rf"(\.\.\.|…)|({NUMBER})|(\s+)", claim)
    for tok in tokens:
        pattern += re.escape(claim[pos:tok.start()])
        before = claim[:tok.start()].rstrip()
        if tok.group(1):
            pattern += r".*?"
        elif tok.group(2):
            is_error = any(before.endswith(m) for m in ERROR_MARKERS)
            numbers.append((tok.group(2), is_error))
            pattern += f"({NUMBER})"
        else:
            pattern += r"\s+"
        pos = tok.end()
    pattern += re.escape(claim[pos:])
    return re.compile(pattern), numbers


def _digits_agree(claimed: str, actual: str) -> bool:
    """Same value to the digits shown in ``claimed`` (integers exactly), or to 1e-12 relative
    (floating-point results may move in the last place between machines)."""
    c, a = float(claimed), float(actual)
    mantissa = re.sub(r"[eE].*", "", claimed)
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(re.search(r"[eE]([-+]?\d+)", claimed).group(1)) if re.search(r"[eE]", claimed) else 0
    half_ulp = 0.5 * 10.0 ** (exponent - decimals)
    return abs(a - c) <= max(half_ulp * (1 + 1e-9), 1e-12 * abs(c))


def _error_agrees(claimed: str, actual: str) -> bool:
    c, a = abs(float(claimed)), abs(float(actual))
    if c == 0 or a == 0:
        return c == a
    return abs(math.log10(a / c)) <= 1.0


def check_claim(claim: str, output: str) -> str | None:
    """None if ``output`` shows ``claim``, else the reason it does not."""
    pattern, numbers = _claim_pattern(claim)
    candidates = list(pattern.finditer(output))
    if not candidates:
        return f"claimed output not found: {claim!r}"
    reasons = []
    for match in candidates:
        bad = [(c, a) for (c, is_err), a in zip(numbers, match.groups())
               if not (_error_agrees(c, a) if is_err else _digits_agree(c, a))]
        if not bad:
            return None
        reasons.append(", ".join(f"{c} (shown) vs {a} (now)" for c, a in bad))
    return f"numbers differ in {claim!r}: {reasons[0]}"


def fresh_copy(dest: Path) -> Path:
    """The tracked files of the repository copied to ``dest`` (a fresh clone without .git)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def run(cmd: Command, cwd: Path, quick: bool, timeout: float = 900) -> tuple[int, str]:
    """Exit status and combined output of the command (or its quick variant) in ``cwd``."""
    text = cmd.quick() if quick else cmd.text
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {text}"], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def checkable(commands: list[Command]) -> list[Command]:
    return [c for c in commands if not CI_COMMANDS.search(c.text)]


def check_all(workdir: Path, quick: bool = True, cheap_only: bool = False,
              pages: list[Path] | None = None) -> list[str]:
    """Run every checkable command of the README and the docs pages (or of ``pages``) in order
    in one fresh copy; the list of failures.

    ``cheap_only``: only the commands matching ``CHEAP`` (for the default test run).  A command
    already run (same text) is not run again: its claims are checked on the first output."""
    cwd = fresh_copy(workdir)
    failures = []
    commands = all_commands(pages)
    if cheap_only:
        commands = [c for c in commands if CHEAP.match(c.text)]
    done: dict[str, tuple[int, str]] = {}
    for cmd in commands:
        if cmd.text not in done:
            done[cmd.text] = run(cmd, cwd, quick)
        status, output = done[cmd.text]
        where = f"{cmd.page} line {cmd.line}"
        if status != 0:
            failures.append(f"{where}: exit {status}: {cmd.text}\n{output[-2000:]}")
            continue
        for claim in cmd.claims:
            reason = check_claim(claim, output)
            if reason:
                failures.append(f"{where}: {reason}\n  command: {cmd.text}\n"
                                f"  output: {output[-1500:]}")
    return failures


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        found = check_all(Path(tmp), quick="--full" not in sys.argv)
    print("\n\n".join(found) if found
          else "every command of the README and the docs ran and showed what it claims")
    sys.exit(1 if found else 0)
