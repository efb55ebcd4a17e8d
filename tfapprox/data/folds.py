"""Fold layouts on disk: the train/vali/test files of a fold directory, and the ``Fold<N>/``
directories of a data set (LETOR 2.0 to 4.0, MSLR)."""

from __future__ import annotations

import os
import re
from pathlib import Path

_SPLIT_FILES = {
    "train": ("train.txt", "trainingset.txt"),
    "vali": ("vali.txt", "validationset.txt"),
    "test": ("test.txt", "testset.txt"),
}


def find_split_files(directory: str | os.PathLike) -> dict[str, Path]:
    """Returns ``{"train", "vali", "test"} -> file`` found in one fold directory.

    Accepts LETOR 4.0 / MSLR names (``train.txt``, ``vali.txt``, ``test.txt``) and LETOR 2.0 / 3.0
    names (``trainingset.txt``, ``validationset.txt``, ``testset.txt``), each optionally ``.gz``, in
    any case (LETOR 2.0 ships ``trainingset.TXT``). Raises ValueError if two names differ only in case,
    FileNotFoundError naming ``directory`` if it is not a directory.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such fold directory (expected one holding "
                                "train.txt, vali.txt and test.txt or LETOR 3.0's names)")
    by_name: dict[str, list[Path]] = {}
    for child in sorted(directory.iterdir()):
        if child.is_file():
            by_name.setdefault(child.name.lower(), []).append(child)
    found = {}
    for split, names in _SPLIT_FILES.items():
        candidates = [by_name[n] for name in names for n in (name, name + ".gz") if n in by_name]
        if not candidates:
            continue
        if len(candidates[0]) > 1:
            raise ValueError(
                f"{directory}: {' and '.join(p.name for p in candidates[0])} differ only in case; "
                "keep one"
            )
        found[split] = candidates[0][0]
    return found


def find_folds(root: str | os.PathLike) -> dict[str, dict[str, Path]]:
    """Returns ``{"Fold1": {"train": path, "vali": path, "test": path}, ...}`` under ``root``.

    Folds come in order of their number (Fold2 before Fold10).

    Raises ``FileNotFoundError`` if ``root`` has no ``Fold<N>`` directory with all three split files.
    """
    root = Path(root)
    folds = {}
    pattern = re.compile(r"fold(\d+)$", re.IGNORECASE)
    for child in sorted(root.iterdir() if root.is_dir() else []):
        match = pattern.match(child.name)
        if match and child.is_dir():
            splits = find_split_files(child)
            missing = sorted(set(_SPLIT_FILES) - set(splits))
            if missing:
                raise FileNotFoundError(
                    f"{child}: no {'/'.join(missing)} file (looked for {_SPLIT_FILES}, in any case)"
                )
            folds[child.name] = (int(match.group(1)), splits)
    if not folds:
        raise FileNotFoundError(f"{root}: no Fold<N>/ directories with train/vali/test files")
    return {name: splits for name, (_, splits) in sorted(folds.items(), key=lambda kv: kv[1][0])}
