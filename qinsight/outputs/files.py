"""Reading and writing the files qinsight makes: bounded reads, atomic writes.

Every output (report files, HTML pages, plots) is written to a temporary file
in the target's folder and renamed over the target, so a failed render never
leaves a truncated or empty file, and no temporary file is left behind on any
error. Reads stop at a size limit whatever the file is: a regular file, a
pipe, a device or standard input.
"""

from __future__ import annotations

import gzip
import lzma
import os
import tempfile
import zlib
from pathlib import Path
from typing import Final, Literal

_CHUNK = 1 << 20
Compression = Literal["gzip", "xz"]
# each compression by the magic bytes its streams start with, and the file name ending that asks for it
MAGIC: Final[dict[Compression, bytes]] = {"gzip": b"\x1f\x8b", "xz": b"\xfd7zXZ\x00"}
SUFFIXES: Final[dict[str, Compression]] = {".gz": "gzip", ".xz": "xz"}
_XZ_MEMORY: Final = 128 * 2**20  # our writer's streams need 9 MiB (preset 6)


def read_capped(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of ``path``; ``ValueError`` once more than ``max_bytes`` arrive (``/dev/zero`` included)."""
    parts: list[bytes] = []
    size = 0
    with open(path, "rb") as stream:
        while chunk := stream.read(min(_CHUNK, max_bytes + 1 - size)):
            parts.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise ValueError(f"larger than the {max_bytes}-byte limit (max_bytes=)")
    return b"".join(parts)


def decompressed(data: bytes, max_bytes: int) -> bytes:
    """``data`` itself, or, where it is gzip or xz (by its magic bytes), what it decompresses to: at
    most ``max_bytes``, whatever the ratio (``ValueError`` past it, or on a stream that is not whole)."""
    kind = next((name for name, magic in MAGIC.items() if data.startswith(magic)), None)
    if kind is None:
        return data
    # xz's dictionary is the stream's to choose (up to 1.5 GiB): a limit refuses a hostile one
    stream = (
        zlib.decompressobj(16 + zlib.MAX_WBITS)
        if kind == "gzip"
        else lzma.LZMADecompressor(lzma.FORMAT_XZ, memlimit=_XZ_MEMORY)
    )
    try:
        text = stream.decompress(data, max_bytes + 1)
    except (zlib.error, lzma.LZMAError) as exc:
        raise ValueError(f"{kind} data that does not decompress: {exc}") from None
    if len(text) > max_bytes:
        raise ValueError(f"decompresses to more than the {max_bytes}-byte limit (max_bytes=)")
    if not stream.eof or stream.unused_data:
        raise ValueError(f"a {kind} stream that is cut short, or followed by other data")
    return text


def compression_of(path: str | os.PathLike[str]) -> Compression | None:
    """The compression a file name asks for: ``.gz`` gzip, ``.xz`` xz, else none."""
    return SUFFIXES.get(Path(path).suffix)


def compressed(text: str, kind: Compression) -> bytes:
    """``text`` as one gzip member (no time stamp) or one xz stream: the same bytes for the same text."""
    data = text.encode("utf-8")
    return gzip.compress(data, compresslevel=6, mtime=0) if kind == "gzip" else lzma.compress(data, preset=6)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: str | os.PathLike[str], content: str | bytes) -> None:
    """Replace ``path`` with ``content`` whole, or leave it as it was.

    The file gets the mode a plain ``open(path, "w")`` would give it (0666 less
    the umask), not the temporary file's 0600.
    """
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(21, "is a folder, not a file", os.fspath(target))
    data = content.encode("utf-8") if isinstance(content, str) else content
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
