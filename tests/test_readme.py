"""The commands of the README and of the docs pages run as written from a fresh copy and show
the outputs they claim."""
import pytest
from readme_check import (
    CHEAP,
    README,
    all_commands,
    check_all,
    check_claim,
    checkable,
    doc_pages,
    page_commands,
    parse_readme,
)


def test_readme_has_commands_with_claimed_outputs():
    commands = checkable(parse_readme(README.read_text()))
    assert len(commands) >= 8
    assert sum(len(c.claims) for c in commands) >= 3


def test_docs_pages_have_commands_with_claimed_outputs():
    """The worked examples moved from the README to the docs stay checked: the user guide's
    pages are found, in pipeline order, and their commands and claims are parsed."""
    pages = [p.relative_to(README.parent).as_posix() for p in doc_pages()]
    guide = [p for p in pages if p.startswith("docs/user_guide/0")]
    assert guide == sorted(guide) and len(guide) == 9
    docs = [c for p in doc_pages() for c in page_commands(p)]
    assert len(docs) >= 20 and sum(len(c.claims) for c in docs) >= 6
    assert sum(bool(CHEAP.match(c.text)) for c in docs) >= 5
    commands = all_commands()
    assert commands[0].page == "README.md" and commands[-1].page.startswith("docs/")


def test_claim_checker_can_fail():
    out = 'E_Bayes = 0.342927798614 +/- 9.2e-10 (method: quad)'
    assert check_claim("E_Bayes = 0.342927798614 +/- 5e-10 (method: quad)", out) is None
    assert check_claim("E_Bayes = 0.3429 +/- ...", out) is None
    assert check_claim("E_Bayes = 0.342927798615 +/- 9.2e-10 (method: quad)", out)   # last digit
    assert check_claim("E_Bayes = 0.342927798614 +/- 9.2e-8 (method: quad)", out)    # 100x error
    assert check_claim("E_Bayes = 0.342927798614 (method: mc)", out)                # text differs
    js = '{"error": 0.49225658076942, "abs_err": 4.1e-12, "method": "quad", "H": 2}'
    assert check_claim('{"error": 0.49225658076942, "abs_err": 5e-12, "method": "quad", ...}', js) is None
    assert check_claim('{"error": 0.4922565807704, ...}', js)


def test_readme_parser_joins_continuations_and_takes_output_blocks():
    text = "x\n```bash\ntheory-kit a --x 1 \\\n    --y 2   # remark\n# out 1.5\n```\n\n```\nmore 2\n```\n"
    (cmd,) = parse_readme(text)
    assert cmd.text == "theory-kit a --x 1 --y 2" and cmd.claims == ["out 1.5", "more 2"]


def test_readme_and_docs_cheap_commands_run_as_written(tmp_path):
    failures = check_all(tmp_path, quick=True, cheap_only=True)
    assert not failures, "\n\n".join(failures)


@pytest.mark.slow
def test_readme_commands_run_as_written_quick(tmp_path):
    """Every command of the README and the docs; full figure runs in their --quick form."""
    failures = check_all(tmp_path, quick=True)
    assert not failures, "\n\n".join(failures)
