"""Every relative link in README.md, CHANGELOG.md and docs/*.md points to a file that
exists and, for a ``#anchor`` into a Markdown file, to one of its headings (GitHub's
heading slugs: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``).
Pure text: a moved section or a renamed file breaks this test, not a reader's click."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
FENCE = re.compile(r"```.*?```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _pages() -> list[str]:
    pages = ["README.md", "CHANGELOG.md"]
    if os.path.isdir(DOCS):
        pages += [f"docs/{f}" for f in sorted(os.listdir(DOCS)) if f.endswith(".md")]
    return [p for p in pages if os.path.isfile(os.path.join(ROOT, p))]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading's text."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def test_slugs_follow_githubs_rule():
    assert slug("Against PufferDrive's C env (the peer kit)") == \
        "against-pufferdrives-c-env-the-peer-kit"
    assert slug("Rendering (`python -m jaxdrive.bench render`)") == \
        "rendering-python--m-jaxdrivebench-render"


@pytest.mark.parametrize("page", _pages())
def test_relative_links_resolve(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        full = (os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path
                else os.path.join(ROOT, page))
        if not os.path.exists(full):
            broken.append(f"{target}: no such file")
        elif anchor and full.endswith(".md") and anchor not in _anchors(full):
            broken.append(f"{target}: no such heading")
    assert broken == [], f"{page}: {broken}"
