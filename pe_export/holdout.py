"""Choose on one part of the inputs, judge on another: the exports that choose by accuracy (int8's smoothing,
calibration ranges, the weights kept float) never see the samples that accept their choice, so the figure
reported is a promise about the next input and not a measure of the fit (constants.HOLDOUT_EVERY)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Cases = tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]  # (feed by case, valid mask by case)


@dataclass(frozen=True)
class Parts:
    """The inputs the choices are made on, those the file is judged on, and what the report says of them."""

    choice: Cases
    check: Cases
    note: str | None = None


def samples(cases: Cases) -> int:
    return sum(int(mask.shape[0]) for mask in cases[1].values())


def split_rows(cases: Cases, every: int) -> tuple[Cases, Cases] | None:
    """(choice part, held-out part) of one case of samples: every ``every``-th sample held out (the last one
    where there are fewer than ``every``); None for a single sample, which cannot be split."""
    ((case, feed),) = cases[0].items()
    valid = cases[1][case]
    rows = int(valid.shape[0])
    held = list(range(every - 1, rows, every)) or ([rows - 1] if rows >= 2 else [])
    if not held:
        return None
    kept = [row for row in range(rows) if row not in set(held)]

    def part(chosen: list[int], name: str) -> Cases:
        index = np.asarray(chosen)
        return {name: {k: np.take(v, index, axis=0) for k, v in feed.items()}}, {name: valid[index]}

    return part(kept, f"{case}, choice part"), part(held, case)


def whole_batches(rows: int, batch: int) -> list[np.ndarray]:
    """The row indices of each run of ``batch`` rows that covers ``rows`` rows, for a file whose batch axis is
    fixed: a short last run is filled with the first rows again (a row judged twice moves no worst-case figure)."""
    return [np.arange(start, start + batch) % rows for start in range(0, rows, batch)]


def in_batches(cases: Cases, batch: int | None) -> Cases:
    """``cases`` cut into cases of ``batch`` rows each (``whole_batches``), for a file whose batch axis is fixed
    (None: as they are)."""
    if batch is None:
        return cases
    feeds, valid = cases
    cut_feeds, cut_valid = {}, {}
    for case, feed in feeds.items():
        rows = int(valid[case].shape[0])
        if rows == batch:
            cut_feeds[case], cut_valid[case] = feed, valid[case]
            continue
        for part, index in enumerate(whole_batches(rows, batch)):
            name = f"{case} {part + 1}" if rows > batch else case
            cut_feeds[name] = {key: np.take(array, index, axis=0) for key, array in feed.items()}
            cut_valid[name] = valid[case][index]
    return cut_feeds, cut_valid
