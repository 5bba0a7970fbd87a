"""The one reading of a path the library is given (a cache folder, a data or profile file, a model's config folder,
an output folder): `~` and environment variables expand as a shell expands them, so `cache_dir="~/.cache/flatcollate"`
is the home folder's cache and never a folder named `~` under the working directory."""

import os
from pathlib import Path


def expand_path(path: str | os.PathLike) -> Path:
    """`path` with a leading `~` (or `~user`) and environment variables (`$VAR`, `${VAR}`) expanded; an unset
    variable is left as written, as `os.path.expandvars` leaves it.

    Args:
        path (`str` or `os.PathLike`).

    Returns:
        `pathlib.Path`, relative when `path` is (nothing is resolved against the working directory).

    >>> expand_path("~/.cache/flatcollate") == Path.home() / ".cache" / "flatcollate"
    True
    >>> expand_path("runs/out")
    PosixPath('runs/out')
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"expected a path (a str or os.PathLike), got {type(path).__name__}: {path!r:.60}.")
    return Path(os.path.expandvars(os.path.expanduser(os.fspath(path))))
