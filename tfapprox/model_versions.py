"""TF Serving's model directory: integer versions, each written whole.

A model directory (TF Serving's `--model_base_path`) holds one subdirectory per version. Only
directories named by ASCII digits are versions, as in TF Serving. A version is written into a
hidden staging directory beside them (`.tmp-...`, which TF Serving ignores because its name is not
a number) and renamed into place in one `os.rename`, so a watcher never sees a half-written
version; a failed write removes its staging directory and leaves no version behind. One left by a
killed writer is removed by the next write into the model directory once that writer, named in
it, is gone (or after a day); nothing else there is ever deleted.
"""

import os
import re
import shutil
import socket
import uuid

from tfapprox.files import remove_abandoned

# A staging directory names its writer: .tmp-<version>-<host>-<pid>-<random hex> (exports of
# tfapprox 0.1.0 wrote .tmp-<version>-<random hex>, with no writer).
_STAGING_NAME = re.compile(r"\.tmp-\d+-(?:(?P<host>.+)-(?P<pid>\d+)-)?[0-9a-f]{32}")
_STAGING_MAX_AGE_SECONDS = 24 * 3600


def next_version(model_dir):
    """Returns the version `write_version` would pick in `model_dir`: 1 + the largest version
    there, or 1 when there is none (or no `model_dir`). A file named like a version (TF Serving
    ignores it) is stepped past too, since the version directory cannot take its name."""
    try:
        names = os.listdir(model_dir)
    except FileNotFoundError:
        return 1
    return max((int(n) for n in names if _is_version(n)), default=0) + 1


def _is_version(name):
    """Whether TF Serving reads directory `name` as a version: ASCII digits only (str.isdigit also
    takes '²' and '٣')."""
    return re.fullmatch(r"[0-9]+", name) is not None


def write_version(base_dir, name, version, write):
    """Returns `base_dir/name/<version>`, written whole by `write(directory)` (see above).

    `version` None picks `next_version`. Refuses a model directory that is a symbolic link
    (ValueError) rather than write through it, and an existing version (FileExistsError).
    """
    model_dir = os.path.join(os.fspath(base_dir), name)
    if os.path.islink(model_dir):
        raise ValueError(
            f"{model_dir} is a symbolic link, and export does not write through links: export to "
            f"the directory it points to, {os.path.realpath(model_dir)}, instead."
        )
    os.makedirs(model_dir, exist_ok=True)
    version = next_version(model_dir) if version is None else int(version)
    target = os.path.join(model_dir, str(version))
    if os.path.lexists(target):
        raise FileExistsError(f"Version {version} of model {name!r} already exists: {target}")

    _remove_stale_staging(model_dir)
    # os.mkdir (unlike tempfile.mkdtemp's 0700) honours the umask, so the renamed version is
    # readable by a TF Serving process running as another user.
    staging = os.path.join(
        model_dir, f".tmp-{version}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}"
    )
    os.mkdir(staging)
    try:
        write(staging)
        if os.path.lexists(target):
            raise FileExistsError(
                f"Version {version} of model {name!r} appeared during export: {target}"
            )
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _remove_stale_staging(model_dir):
    """Deletes the staging directories of killed writers: those whose writer on this host is no
    longer running, or untouched for a day (another host's, or 0.1.0's, which name no writer)."""
    remove_abandoned(model_dir, _STAGING_NAME, max_age_seconds=_STAGING_MAX_AGE_SECONDS)
