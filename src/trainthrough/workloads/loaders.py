"""Readers for public datasets in their distribution formats: MovieLens ratings and
UCI bag-of-words corpora.

They read plain text line by line and never unpickle anything. Any file that does not
match its format raises :class:`UserError` naming the file and the line, because a
corrupt or mislabelled download is the user's to fix, not a bug to trace.
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from trainthrough.errors import UserError
from trainthrough.workloads._data import require_file

_FLOAT32_MAX = float(np.finfo(np.float32).max)  # ratings are stored as float32
_MAX_COUNT = 2**31 - 1  # a word's count in one document; int64 sums stay exact


@dataclass
class Ratings:
    """Observed ratings with user and item ids remapped to ``0..n-1``."""

    users: np.ndarray   # int64, one per rating
    items: np.ndarray   # int64
    values: np.ndarray  # float32
    n_users: int
    n_items: int


@dataclass
class Corpus:
    """A bag-of-words corpus as sparse (doc, word, count) triples, 0-based ids."""

    docs: np.ndarray    # int64, one per distinct (doc, word) pair
    words: np.ndarray   # int64
    counts: np.ndarray  # int64, > 0
    n_docs: int
    n_words: int
    vocab: list[str] = field(default_factory=list)


def _open(path: Path) -> IO[str]:
    require_file(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open(encoding="utf-8", errors="replace")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, stripped line) for the non-blank lines of ``path``."""
    try:
        with _open(path) as f:
            for no, line in enumerate(f, 1):
                line = line.strip()
                if line:
                    yield no, line
    except (OSError, EOFError, zlib.error) as e:  # e.g. a truncated or corrupt .gz
        raise UserError(f"{path}: cannot read: {e}") from None


def _remap(ids: list[str]) -> tuple[np.ndarray, int]:
    """Contiguous indices in order of first appearance (stable across runs)."""
    index: dict[str, int] = {}
    out = np.fromiter((index.setdefault(i, len(index)) for i in ids), np.int64, len(ids))
    return out, len(index)


def load_ratings(path: str | Path) -> Ratings:
    """Read a MovieLens ratings file, whichever of the three layouts it uses.

    ``ml-100k`` ``u.data`` (``user<TAB>item<TAB>rating<TAB>timestamp``), ``ml-1m``/
    ``ml-10m`` ``ratings.dat`` (``user::item::rating::timestamp``) and ``ml-latest``
    CSV with a ``userId,movieId,rating,timestamp`` header. The layout is detected
    from the first line; a timestamp column is optional.

    Raises:
        UserError: missing file, empty file, or a line that is not
            ``user, item, numeric rating`` in the detected layout.
    """
    path = Path(path)
    users: list[str] = []
    items: list[str] = []
    values: list[float] = []
    sep: str | None = None
    for no, line in _lines(path):
        if sep is None:
            if line.lower().startswith("userid"):  # ml-latest CSV header
                sep = ","
                continue
            sep = "::" if "::" in line else ("\t" if "\t" in line else ",")
        parts = line.split(sep)
        try:
            if len(parts) not in (3, 4):
                raise ValueError
            rating = float(parts[2])
            if not math.isfinite(rating) or abs(rating) > _FLOAT32_MAX:
                raise ValueError
        except ValueError:
            shown = "<TAB>" if sep == "\t" else sep
            raise UserError(
                f"{path}:{no}: expected 'user{shown}item{shown}rating[{shown}timestamp]' with "
                f"a finite numeric rating, got {line[:60]!r}") from None
        users.append(parts[0].strip())
        items.append(parts[1].strip())
        values.append(rating)
    if not values:
        raise UserError(f"{path}: no ratings found")
    u, n_users = _remap(users)
    i, n_items = _remap(items)
    return Ratings(u, i, np.asarray(values, np.float32), n_users, n_items)


def _int_fields(path: Path, no: int, line: str, n: int, what: str) -> list[int]:
    parts = line.split()
    try:
        if len(parts) != n:
            raise ValueError
        return [int(p) for p in parts]
    except ValueError:
        raise UserError(f"{path}:{no}: expected {what}, got {line[:60]!r}") from None


def load_uci_bow(docword_path: str | Path, vocab_path: str | Path | None = None) -> Corpus:
    """Read a UCI bag-of-words corpus (``docword.*.txt`` or ``.txt.gz``).

    The file starts with three lines D (documents), W (vocabulary size) and NNZ,
    then NNZ lines ``docID wordID count`` with 1-based ids. ``vocab_path`` (one
    word per line, W lines) is optional and only used to name topics.

    Raises:
        UserError: missing file, bad header, an id out of range, a non-positive
            count, a line count that differs from NNZ, or a vocabulary of the
            wrong length.
    """
    path = Path(docword_path)
    lines = _lines(path)
    header: list[int] = []
    for no, line in lines:
        header += _int_fields(path, no, line, 1, "a header integer (D, W or NNZ)")
        if len(header) == 3:
            break
    if len(header) < 3:
        raise UserError(f"{path}: expected three header lines D, W, NNZ")
    n_docs, n_words, nnz = header
    if min(header) < 0 or n_docs == 0 or n_words == 0:
        raise UserError(f"{path}: header D={n_docs}, W={n_words}, NNZ={nnz} must be positive")
    triples: list[list[int]] = []
    size = 0  # characters of entries read: what the header's sizes are bounded by
    for no, line in lines:
        size += len(line) + 1
        d, w, c = _int_fields(path, no, line, 3, "'docID wordID count'")
        if not (1 <= d <= n_docs and 1 <= w <= n_words and 0 < c <= _MAX_COUNT):
            raise UserError(f"{path}:{no}: docID must be in 1..{n_docs}, wordID in "
                            f"1..{n_words} and count in 1..{_MAX_COUNT}, got {line[:60]!r}")
        triples.append([d - 1, w - 1, c])
    if len(triples) != nnz:
        raise UserError(f"{path}: header says NNZ={nnz} but found {len(triples)} entries")
    if not triples:
        raise UserError(f"{path}: the corpus has no words")
    # D and W size dense arrays later (LDA's counts); a header claiming more documents
    # or words than the file has characters is corrupt, not a corpus to allocate for.
    if max(n_docs, n_words) > size:
        raise UserError(f"{path}: header says D={n_docs} documents and W={n_words} words, "
                        f"more than the {size} characters of entries in the file "
                        "(truncated or mislabelled file?)")
    arr = np.asarray(triples, np.int64)
    vocab: list[str] = []
    if vocab_path is not None:
        vocab = [line for _, line in _lines(Path(vocab_path))]
        if len(vocab) != n_words:
            raise UserError(f"{vocab_path}: expected {n_words} words (W in {path}), "
                            f"found {len(vocab)}")
    return Corpus(arr[:, 0], arr[:, 1], arr[:, 2], n_docs, n_words, vocab)
