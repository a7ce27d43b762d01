"""mkdocs hooks (mkdocs.yml): pages of the site that live outside docs/, and links written for the repository.

- The README is the site's home page (index.md), and every model card - `src/docembed/zoo/NAME/card.md`,
  `src/docembed/models/cards/NAME.md` - is the page `zoo/NAME.md`. They are read where they are, never copied
  into docs/, so each stays the one place its text is kept.
- Links are written so that they work when the markdown is read in the repository (the README links
  `docs/search.md`, a guide links `../src/docembed/zoo/student/card.md`). Before a page is rendered, each
  relative link that resolves to one of those files is rewritten to the site's page for it; any other link
  is left alone, so mkdocs' strict checks still catch a link to nothing.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _cards() -> dict[Path, str]:
    shipped = {path: f"zoo/{path.parent.name}.md" for path in (ROOT / "src/docembed/zoo").glob("*/card.md")}
    fitted = {path: f"zoo/{path.stem}.md" for path in (ROOT / "src/docembed/models/cards").glob("*.md")}
    return dict(sorted({**shipped, **fitted}.items()))


# files outside docs/ that are pages of the site -> their path in the site
OUTSIDE = {ROOT / "README.md": "index.md", **_cards()}
LINK = re.compile(r"\]\(([^()\s]+)\)")


def on_files(files, config):
    for source, uri in OUTSIDE.items():
        files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files


def _site_path(target: Path) -> str | None:
    """The site's path of the page a repository file is, or None when it is none."""
    if target in OUTSIDE:
        return OUTSIDE[target]
    if target.is_relative_to(DOCS) and target.suffix == ".md":
        return target.relative_to(DOCS).as_posix()
    return None


def on_page_markdown(markdown, page, config, files):
    source = Path(page.file.abs_src_path).resolve()
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        link = match.group(1)
        if "://" in link or link.startswith(("#", "/", "mailto:")):
            return match.group(0)
        path, _, anchor = link.partition("#")
        uri = _site_path((source.parent / path).resolve())
        if uri is None:
            return match.group(0)
        new = posixpath.relpath(uri, here or ".") + (f"#{anchor}" if anchor else "")
        return f"]({new})"

    return LINK.sub(rewrite, markdown)
