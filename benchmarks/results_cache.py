"""The experiments' cache of finished runs: one JSON file per run, and packs of many runs.

`write_cached` writes a run's result as its own file, CACHE/`Run.cache_path`, whole or not at
all, so a killed `run` resumes after the last run it finished. `pack` moves the files into packs,
one per set: CACHE/NAME.jsonl.xz, xz-compressed JSON lines `{"key": the file's path under CACHE,
"result": its result}` in the order of their keys, so a cache of thousands of runs is a few
files (the shared sets' committed cache is). `read_cached` reads a run's file where there is
one, else its line in the set's pack; `unpack` turns packs back into files.
"""

from __future__ import annotations

import functools
import json
import lzma
import os
from pathlib import Path
from typing import Any, Callable

PACK_SUFFIX = ".jsonl.xz"
REQUIRED = {"validation", "qids", "test"}  # what a complete result holds


def read_cached(cache: Path, run, say: Callable[[str], None]) -> dict[str, Any] | None:
    """Returns the cached result of `run` (a `benchmarks.experiment_runs.Run`): its file's where
    it has one, else its pack's; None when there is none, or when its file holds no complete
    result (empty, cut short, not a result), or when it is not in a pack that could not be read
    whole: then `say` gets one line naming the file, or each of the pack's problems."""
    path = run.cache_path(cache)
    try:
        text = path.read_text()
    except FileNotFoundError:
        pass
    else:
        return _parsed(path, text, say)
    entries, problems = _pack_entries(cache / f"{run.dataset}{PACK_SUFFIX}")
    key = _key(cache, path)
    if key not in entries:
        for problem in problems:
            say(problem)
    return entries.get(key)


def write_cached(cache: Path, run, result: dict[str, Any]) -> None:
    """Writes `result` as `run`'s file in `cache` (a killed write leaves no half-written file)."""
    _write_file(run.cache_path(cache), result)


def pack(cache: Path, say: Callable[[str], None]) -> int:
    """Moves every complete result file under `cache` into its set's pack (a file replaces the
    pack's line of the same key), then removes the files and the folders this empties; returns
    how many files it packed. A file that holds no complete result is named and left; a set
    whose pack cannot be read whole is named and left as it is. Run it when no `run` writes to
    `cache`."""
    by_set: dict[str, dict[str, tuple[Path, dict[str, Any]]]] = {}
    for path in sorted(cache.rglob("*.json")):
        result = _parsed(path, path.read_text(), say)
        if result is not None:
            key = _key(cache, path)
            by_set.setdefault(key.split("/")[0], {})[key] = path, result
    packed = 0
    for name, files in by_set.items():
        target = cache / f"{name}{PACK_SUFFIX}"
        entries, problems = _pack_entries(target)
        if problems:
            say(f"{name} not packed: its pack {target} could not be read whole ({problems[0]})")
            continue
        merged = {**entries, **{key: result for key, (_, result) in files.items()}}
        _write_pack(target, merged)
        for path, _ in files.values():
            path.unlink()
            _remove_empty_folders(path.parent, cache)
        packed += len(files)
        say(f"{target}: {len(files)} runs packed, {len(merged)} in all")
    return packed


def unpack(cache: Path, say: Callable[[str], None]) -> int:
    """Writes every run of `cache`'s packs as its file (where it has none: a file is newer than
    its pack's line), then removes each pack read whole; returns how many files it wrote."""
    written = 0
    for target in sorted(cache.glob(f"*{PACK_SUFFIX}")):
        entries, problems = _pack_entries(target)
        for key, result in entries.items():
            path = cache / key
            if not path.exists():
                _write_file(path, result)
                written += 1
        for problem in problems:
            say(problem)
        if not problems:
            target.unlink()
        say(f"{target}: {len(entries)} runs unpacked" + (", the pack kept" if problems else ""))
    return written


def _write_file(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(_dumps(result) + "\n")
    os.replace(partial, path)


def _parsed(path: Path, text: str, say: Callable[[str], None]) -> dict[str, Any] | None:
    """Returns the complete result that the file `path` holds as `text`, None (and one line to
    `say`) for any other content."""
    try:
        result = json.loads(text)
    except json.JSONDecodeError as err:
        problem = "empty" if not text.strip() else str(err)
    else:
        if _complete(result):
            return result
        problem = "no validation, qids and test"
    say(f"unreadable cached run, counted as not run: {path} ({problem})")
    return None


def _complete(result) -> bool:
    return isinstance(result, dict) and REQUIRED <= result.keys()


def _key(cache: Path, path: Path) -> str:
    return path.relative_to(cache).as_posix()


def _pack_entries(target: Path) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """Returns ({key: result} of the pack `target`, the problems met reading it); read once for
    each version of the file (its size and modification time)."""
    try:
        stat = target.stat()
    except FileNotFoundError:
        return {}, ()
    return _read_pack(str(target), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)  # a report reads the packs of the sets it shows, runs many times
def _read_pack(target: str, size: int, mtime_ns: int):
    entries, problems = {}, []
    try:
        with lzma.open(target, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as err:
                    problems.append(f"unreadable pack line, counted as not run: {target} line "
                                    f"{number} ({err})")
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("key"), str) and _complete(
                        entry.get("result")):
                    entries[entry["key"]] = entry["result"]
                else:
                    problems.append(f"unreadable pack line, counted as not run: {target} line "
                                    f"{number} (no key and complete result)")
    except (lzma.LZMAError, EOFError, UnicodeDecodeError) as err:
        problems.append(f"unreadable pack, its later runs counted as not run: {target} ({err})")
    return entries, tuple(problems)


def _write_pack(target: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Writes the pack `target` of `entries` in the order of their keys (the same entries give
    the same bytes), whole or not at all."""
    text = "".join(_dumps({"key": key, "result": entries[key]}) + "\n" for key in sorted(entries))
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(lzma.compress(text.encode("utf-8"), preset=9))
    os.replace(partial, target)


def _dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _remove_empty_folders(folder: Path, cache: Path) -> None:
    """Removes `folder` and the folders above it, up to `cache`, while they are empty."""
    while folder != cache and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
