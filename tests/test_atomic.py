"""The atomic write: the target holds the old content or the new, never part of either,
and a failed write leaves no temp file."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainthrough._atomic import atomic_open, atomic_write, temp_path


def test_writes_text_and_bytes_and_replaces(tmp_path: Path) -> None:
    p = tmp_path / "f.json"
    atomic_write(p, "old ±\n", encoding="utf-8")
    assert p.read_text(encoding="utf-8") == "old ±\n"
    atomic_write(p, b"\x00new")
    assert p.read_bytes() == b"\x00new"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.json"]


def test_a_failure_mid_write_keeps_the_old_content_and_no_temp_file(tmp_path: Path) -> None:
    p = tmp_path / "results.csv"
    p.write_text("old\n")
    with pytest.raises(RuntimeError, match="disk on fire"), atomic_open(p, "w") as f:
        f.write("half of the new")
        f.flush()
        assert temp_path(p).read_text() == "half of the new"  # written beside, not over
        assert p.read_text() == "old\n"
        raise RuntimeError("disk on fire")
    assert p.read_text() == "old\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["results.csv"]


def test_a_failure_to_encode_keeps_the_old_content(tmp_path: Path) -> None:
    p = tmp_path / "advice.md"
    p.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        atomic_write(p, "new ±", encoding="ascii")
    assert p.read_text() == "old\n" and not temp_path(p).exists()


def test_only_writing_modes(tmp_path: Path) -> None:
    for mode in ("a", "r+", "w+"):
        with pytest.raises(ValueError, match="new file"), atomic_open(tmp_path / "x", mode):
            pass
    assert not any(tmp_path.iterdir())
