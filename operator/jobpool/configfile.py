"""Configuration read from a file a variable names (`JOBPOOL_RATE_LIMITS=@/path`, the admin
API's `JOBPOOL_API_JWT_PUBLIC_KEY`).

The path comes from the environment, so it may name anything the process can read: a
device that never ends (`/dev/zero`), a directory, a file of secrets. So a read stops one
byte past the limit, and errors name the file and the problem but never repeat its content.
"""

from __future__ import annotations

from pathlib import Path

MAX_BYTES = 1024 * 1024
"""Rate limits, a public key or a JWKS are kilobytes; a mebibyte is far beyond any real one."""


def read_config_file(path: Path, *, limit: int = MAX_BYTES) -> str:
    """The UTF-8 text of `path`, read at most `limit` + 1 bytes.

    Raises ValueError naming the problem (cannot be read, is a directory, longer than `limit`
    bytes, not UTF-8 text), never quoting the file's content.
    """
    try:
        with path.open("rb") as file:
            data = file.read(limit + 1)
    except IsADirectoryError:
        raise ValueError("it is a directory, not a file") from None
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or type(exc).__name__}") from None
    if len(data) > limit:
        raise ValueError(f"longer than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start + 1} cannot be decoded)") from None
