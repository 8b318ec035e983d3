"""Real inputs from text: lines of a file tokenized with the model's tokenizer.json (numpy + tokenizers).

Generated token ids are uniform over the vocabulary; a trained encoder sees a very different
distribution, and int8 ranges or a lossy table judged on random ids say little about real text.
Which input takes the token ids is read from the model: the integer input that indexes the largest
table (the vocabulary); a mask input gets 1 on real tokens, every other integer input 0 (segment 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pe_export.errors import BadInputError, missing_extra, one_line
from pe_export.inputs import is_mask_input
from pe_export.specs import TensorSpec

TOKENIZER_FILE = "tokenizer.json"
MAX_TEXT_LINES = 4096


@dataclass(frozen=True)
class TextInputs:
    """``--text FILE`` with the tokenizer to read it (default: tokenizer.json beside or inside the model)."""

    text: Path
    tokenizer: Path | None = None
    option: str = "--text"  # the option that gave ``text``, for messages (--holdout reads the same form)
    mask_inputs: tuple[str, ...] = ()  # --mask-input: padding masks the user names, beside those the graph shows

    def tokenizer_path(self, saved_model: Path) -> Path:
        if self.tokenizer is not None:
            return self.tokenizer
        for candidate in (
            saved_model / TOKENIZER_FILE,
            saved_model / "assets" / TOKENIZER_FILE,
            saved_model.parent / TOKENIZER_FILE,
        ):
            if candidate.is_file():
                return candidate
        raise BadInputError(
            f"--text needs the model's tokenizer: no {TOKENIZER_FILE} in {saved_model}, its assets/ or its folder; "
            "pass --tokenizer PATH/tokenizer.json"
        )


def read_lines(path: Path, option: str = "--text") -> list[str]:
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as err:
        raise BadInputError(
            f"{option} {path} cannot be read as UTF-8 text ({err.__class__.__name__}); expected one sentence per line"
        ) from None
    lines = [line for line in lines if line]
    if not lines:
        raise BadInputError(f"{option} {path} has no non-empty line; expected one sentence per line")
    if len(lines) > MAX_TEXT_LINES:
        raise BadInputError(f"{option} {path} has {len(lines):,} lines; at most {MAX_TEXT_LINES:,} are read")
    return lines


def text_feed(
    specs: list[TensorSpec],
    bounds: dict[str, int],
    inputs: TextInputs,
    saved_model: Path,
    max_len: int | None,
    length: int | None = None,
    masks: frozenset[str] | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(feed, valid [rows, length]): every line one row, padded to the longest, or to ``length`` (a --seq-len), or
    to the model's fixed length; a longer line is cut there."""
    try:
        from tokenizers import Tokenizer
    except ImportError as err:
        raise missing_extra("tokenizers", "text") from err
    path = inputs.tokenizer_path(saved_model)
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises its own Exception type for bad JSON
        raise BadInputError(f"--tokenizer {path} is not a tokenizers JSON file ({one_line(err)[:120]})") from None
    tokenizer.no_padding()  # a tokenizer.json may pad to 128 by default: each sentence then is mostly padding
    integer = [spec for spec in specs if spec.is_integer and spec.has_sequence]
    if not integer:
        raise BadInputError("--text: the model has no integer [batch, sequence] input to take token ids")
    masks = _named_masks(specs, masks, inputs.mask_inputs)
    tokens = max((s for s in integer if not is_mask_input(s, masks)), key=lambda s: bounds.get(s.name, 0), default=None)
    if tokens is None:
        raise BadInputError("--text: every integer input of the model is a mask; none takes token ids")
    fixed = tokens.sequence_length or length
    limit = fixed or max_len
    encoded = [tokenizer.encode(line).ids for line in read_lines(inputs.text, inputs.option)]
    if limit is not None:
        encoded = [ids[:limit] for ids in encoded]
    length = fixed or max(len(ids) for ids in encoded)
    vocabulary = bounds.get(tokens.name)
    high = max(max(ids, default=0) for ids in encoded)
    if vocabulary is not None and high >= vocabulary:
        raise BadInputError(
            f"--tokenizer {path} gives token id {high}, but the model's {tokens.name!r} table has {vocabulary} "
            "rows; is it this model's tokenizer.json?"
        )
    pad = tokenizer.token_to_id("[PAD]") or tokenizer.token_to_id("<pad>") or 0
    ids = np.full((len(encoded), length), pad, dtype=np.int64)
    valid = np.zeros((len(encoded), length), dtype=bool)
    for row, sequence in enumerate(encoded):
        ids[row, : len(sequence)] = sequence
        valid[row, : len(sequence)] = True
    return _feed(specs, tokens.name, ids, valid, bounds, masks), valid


def _named_masks(
    specs: list[TensorSpec], masks: frozenset[str] | None, named: tuple[str, ...]
) -> frozenset[str] | None:
    """The graph's masks and those --mask-input names (each an integer input of the model)."""
    integer = {spec.name for spec in specs if spec.is_integer}
    for name in named:
        if name not in integer:
            raise BadInputError(
                f"--mask-input {name}: the model has no integer input of that name; its integer inputs: "
                f"{', '.join(sorted(integer)) or 'none'}"
            )
    return masks if not named else frozenset(masks or ()) | set(named)


def _feed(
    specs: list[TensorSpec],
    tokens: str,
    ids: np.ndarray,
    valid: np.ndarray,
    bounds: dict[str, int],
    masks: frozenset[str] | None,
) -> dict[str, np.ndarray]:
    """Every input's array: the token ids, the padding masks' valid positions, segment ids of the first segment."""
    feed = {}
    for spec in specs:
        if spec.name == tokens:
            array = ids
        elif is_mask_input(spec, masks):
            array = valid.astype(np.int64)
        elif spec.is_integer and (spec.name in bounds or masks is None):
            # segment (type) ids: every token in the first segment; per-token extras (LayoutLM's boxes) zeros
            array = np.zeros(ids.shape + tuple(size or 1 for size in spec.shape[2:]), ids.dtype)
        elif spec.is_integer:
            raise BadInputError(
                f"--text: the model's integer input {spec.name!r} indexes no table and is no padding mask its "
                f"attention reads (from its graph and its name); pass --mask-input {spec.name} if it is the padding "
                "mask, else give every input with --inputs FILE.npz"
            )
        else:
            raise BadInputError(f"--text: the model also takes float input {spec.name!r}; give it with --inputs")
        feed[spec.name] = array.astype(np.dtype(spec.dtype))
    return feed
