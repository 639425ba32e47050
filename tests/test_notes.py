"""The notes the code cites live in the repository (docs/notes/), and every citation resolves."""

from __future__ import annotations

import re
import subprocess

from tests.layering import ROOT

CITATION = re.compile(r"\bdocs/notes/[\w.-]+\.md\b")


def test_every_cited_note_is_in_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    cited = {}
    for name in tracked:
        if name.endswith((".py", ".md", ".toml", ".txt", "Makefile")):
            for note in CITATION.findall((ROOT / name).read_text(errors="replace")):
                cited.setdefault(note, name)
    assert cited, "no citation found: the pattern no longer matches how notes are cited"
    missing = {note: by for note, by in cited.items() if not (ROOT / note).is_file()}
    assert not missing, f"cited but not in the repository (note: first file citing it): {missing}"
