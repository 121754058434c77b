"""Regenerate the bundled example documents from Jane Austen's novels (public domain).

Source: the Debian package `r-cran-janeaustenr`, whose R data files hold each novel as
a vector of lines (Project Gutenberg text). They are read without R through PyPI `rdata`.

    python assets/make_assets.py                      # runs `apt-get download` itself
    python assets/make_assets.py --deb r-cran-janeaustenr_1.0.0-1_all.deb
    python assets/make_assets.py --data-dir .../janeaustenr/data

Output (next to this script): pride_and_prejudice.txt (the whole novel, for runs at the paper's
lengths), pride_and_prejudice_ch1-12.txt, persuasion_excerpt.txt.
"""

from __future__ import annotations

import argparse
import gzip
import re
import subprocess
import tempfile
import warnings
import zlib
from pathlib import Path

import rdata

HERE = Path(__file__).resolve().parent

# (output file, R variable, title line, chapters kept; None: the whole novel)
ASSETS = [
    ("pride_and_prejudice.txt", "prideprejudice", "Pride and Prejudice, by Jane Austen (1813).", None),
    ("pride_and_prejudice_ch1-12.txt", "prideprejudice",
     "Pride and Prejudice, by Jane Austen (1813). Chapters 1-12.", 12),
    ("persuasion_excerpt.txt", "persuasion",
     "Persuasion, by Jane Austen (1817). Chapters 1-4.", 4),
]


def read_novels(data_dir: Path) -> dict[str, list[str]]:
    """Read every novel from an R lazy-load database (Rdata.rdx index + Rdata.rdb blobs)."""
    def parse(raw: bytes):
        with warnings.catch_warnings():  # rdata warns that the data has no RDS file header
            warnings.simplefilter("ignore")
            return rdata.conversion.convert(rdata.parser.parse_data(raw))

    index = parse(gzip.decompress((data_dir / "Rdata.rdx").read_bytes()))
    blob = (data_dir / "Rdata.rdb").read_bytes()
    novels = {}
    for name, (offset, length) in index["variables"].items():
        # Each object: 4-byte uncompressed length, then a zlib stream of an R serialization.
        raw = zlib.decompress(blob[offset + 4: offset + length])
        novels[str(name)] = [str(line) for line in parse(raw)]
    return novels


def chapters_as_prose(lines: list[str], title: str, n_chapters: int | None, heading: str = r"(?i)chapter \d+") -> str:
    """Chapters 1..n_chapters (all when None) with each hard-wrapped paragraph joined into one line;
    a chapter starts at a line that matches ``heading`` whole."""
    starts = [i for i, line in enumerate(lines) if re.fullmatch(heading, line.strip())]
    end = starts[n_chapters] if n_chapters is not None and n_chapters < len(starts) else len(lines)
    paragraphs, current = [], []
    for line in lines[starts[0]:end] + [""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    text = "\n\n".join(paragraphs)
    text = re.sub(r"_([^_]+)_", r"\1", text)  # Gutenberg marks italics as _word_
    text = re.sub(r" {2,}", " ", text)
    return title + "\n\n" + text + "\n"


def extract_deb(deb: Path, into: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(into)], check=True)
    return next(into.rglob("janeaustenr/data"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deb", type=Path, help="a downloaded r-cran-janeaustenr .deb")
    parser.add_argument("--data-dir", type=Path, help="janeaustenr/data with Rdata.rdb/.rdx")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data_dir = args.data_dir
        if data_dir is None:
            deb = args.deb
            if deb is None:
                subprocess.run(["apt-get", "download", "r-cran-janeaustenr"], cwd=tmp, check=True)
                deb = next(tmp.glob("r-cran-janeaustenr_*.deb"))
            data_dir = extract_deb(deb, tmp / "x")
        novels = read_novels(data_dir)
        for filename, variable, title, n_chapters in ASSETS:
            text = chapters_as_prose(novels[variable], title, n_chapters)
            (HERE / filename).write_text(text, encoding="utf-8")
            print(f"{filename}: {len(text.encode()):,} bytes")


if __name__ == "__main__":
    main()
