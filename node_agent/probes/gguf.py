"""A reader for a GGUF file's metadata header (no tensor data, no llama.cpp, no mlx).

Layout (GGUF v2/v3, little-endian): b"GGUF", u32 version, u64 tensor count,
u64 key/value count, then per key: string key, u32 value type, value. Arrays
are skipped (only their length is kept), so reading even a 49k-token
vocabulary costs a few milliseconds.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
MetaValue = int | float | bool | str


@dataclass(frozen=True)
class GgufHeader:
    version: int
    tensor_count: int
    metadata: dict[str, MetaValue]  # scalars and strings
    array_lengths: dict[str, int]  # arrays: only their length
    header_bytes: int  # where the metadata section ends

    def arch_value(self, suffix: str) -> MetaValue | None:
        arch = self.metadata.get("general.architecture")
        return self.metadata.get(f"{arch}.{suffix}") if isinstance(arch, str) else None


class _Reader:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def unpack(self, fmt: str) -> tuple[int | float | bool, ...]:
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise ValueError("GGUF header is truncated")
        return struct.unpack(fmt, data)

    def u32(self) -> int:
        return int(self.unpack("<I")[0])

    def u64(self) -> int:
        return int(self.unpack("<Q")[0])

    def string(self) -> str:
        length = self.u64()
        if length > 1 << 24:
            raise ValueError(f"implausible GGUF string length {length}")
        return self.f.read(length).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> MetaValue:
        if vtype == _STRING:
            return self.string()
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.unpack(fmt)[0]

    def skip_array(self) -> int:
        item_type, count = self.u32(), self.u64()
        if item_type == _STRING:
            for _ in range(count):
                self.f.seek(self.u64(), 1)
        elif item_type == _ARRAY:
            for _ in range(count):
                self.skip_array()
        else:
            fmt = _SCALARS.get(item_type)
            if fmt is None:
                raise ValueError(f"unknown GGUF array item type {item_type}")
            self.f.seek(struct.calcsize(fmt) * count, 1)
        return count


def read_gguf_header(path: Path) -> GgufHeader:
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        r = _Reader(f)
        version = r.u32()
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        tensor_count, kv_count = r.u64(), r.u64()
        metadata: dict[str, MetaValue] = {}
        arrays: dict[str, int] = {}
        for _ in range(kv_count):
            key = r.string()
            vtype = r.u32()
            if vtype == _ARRAY:
                arrays[key] = r.skip_array()
            else:
                metadata[key] = r.value(vtype)
        return GgufHeader(version, tensor_count, metadata, arrays, f.tell())
