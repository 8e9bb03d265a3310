"""The one way a benchmark script rewrites its section of a docs page: the text from the
section's ``## `` heading to the next one is replaced, or appended when the page lacks it."""

from __future__ import annotations

from pathlib import Path


def replace_section(page: Path, section: str, body: str, new_page: str = "") -> None:
    page.parent.mkdir(parents=True, exist_ok=True)
    text = page.read_text() if page.exists() else new_page
    start = text.find(section)
    if start >= 0:
        nxt = text.find("\n## ", start + len(section))
        text = text[:start] + body + ("\n" + text[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    page.write_text(text)
