"""The documentation a user navigates: a short README, every page under docs/ reachable from it, and every relative link and image in them pointing at a file that exists."""

import re

from tests.conftest import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def links_of(page) -> list[str]:
    """The relative targets of a markdown page's links and images, without anchors (web addresses left out)."""
    return [t.split("#")[0] for t in LINK.findall(page.read_text()) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_the_readme_is_short_and_reaches_every_page():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 150
    pages = set((ROOT / "docs").glob("*.md"))
    assert len(pages) >= 10
    reached, todo = set(), [readme]
    while todo:
        page = todo.pop()
        for target in links_of(page):
            path = (page.parent / target).resolve()
            if path.suffix == ".md" and path not in reached and path.is_file():
                reached.add(path)
                todo.append(path)
    assert not {p.resolve() for p in pages} - reached, "pages no link reaches"


def test_every_relative_link_and_image_exists():
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in [ROOT / "README.md", ROOT / "infra" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
              for target in links_of(page) if target and not (page.parent / target).exists()]
    assert not broken
