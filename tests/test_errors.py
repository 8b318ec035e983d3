"""One line from any exception: what every one-line error message is built from."""

from __future__ import annotations

from pe_export.errors import one_line


def test_one_line_takes_the_first_non_empty_line_or_the_type() -> None:
    assert one_line(ValueError("\n  \n  shapes differ: 3 vs 4  \ntraceback-ish detail")) == "shapes differ: 3 vs 4"
    assert one_line(RuntimeError()) == "RuntimeError"  # was an IndexError (exit 6) in four places
    assert one_line(OSError("   ")) == "OSError"
