"""Every source file opens with a one-line statement of its job: a module docstring whose first line stands alone, or a comment under a script's shebang."""

import ast
import subprocess

from tests.conftest import ROOT


def _tracked(*patterns: str) -> list[str]:
    return subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


def test_every_python_file_opens_with_a_one_line_statement_of_its_job():
    missing = []
    for path in _tracked("*.py"):
        doc = ast.get_docstring(ast.parse((ROOT / path).read_text()))
        if not doc or not doc.splitlines()[0].strip().endswith((".", ":", ")")):
            missing.append(path)
    assert missing == []


def test_every_script_says_what_it_does_under_its_shebang():
    missing = [path for path in _tracked("infra/*.sh", ".ci/*")
               if not (ROOT / path).read_text().splitlines()[1:2] or not (ROOT / path).read_text().splitlines()[1].startswith("# ")]
    assert missing == []
