"""GGUF files for the Python tests, written and read by hand (format v3: header, metadata,
tensor infos, 32-byte aligned data), so the test venv needs no `gguf` package.

`write(path, metadata, tensors)` takes metadata as `(key, kind, value)` triples (`kind` a
`T_*` constant, or `(T_ARRAY, inner)` for a list) and tensors as `(name, shape, ggml_type,
bytes)` with `shape` outermost first (numpy order; GGUF stores it reversed).
`read_metadata(path)` returns a file's metadata as a dict of Python values (its tensors are
not read).
"""

from __future__ import annotations

import struct
from pathlib import Path

GGML_F32, GGML_F16, GGML_MXFP4 = 0, 1, 39
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY = range(10)
T_U64, T_I64, T_F64 = 10, 11, 12

_SCALARS = {
    T_U8: "<B",
    T_I8: "<b",
    T_U16: "<H",
    T_I16: "<h",
    T_U32: "<I",
    T_I32: "<i",
    T_F32: "<f",
    T_BOOL: "<?",
    T_U64: "<Q",
    T_I64: "<q",
    T_F64: "<d",
}


def _string(text: str) -> bytes:
    data = text.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(data)) + data


def _value(kind: int, value) -> bytes:
    if kind == T_STRING:
        return _string(value)
    return struct.pack(_SCALARS[kind], value)


def write(path: str | Path, metadata: list, tensors: list) -> Path:
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, kind, value in metadata:
        out += _string(key)
        if isinstance(kind, tuple):
            _, inner = kind
            out += struct.pack("<IIQ", T_ARRAY, inner, len(value))
            if inner == T_STRING:
                out += b"".join(_string(item) for item in value)
            else:
                out += struct.pack(f"<{len(value)}{_SCALARS[inner][1]}", *value)
        else:
            out += struct.pack("<I", kind) + _value(kind, value)
    offset = 0
    data = bytearray()
    for name, shape, kind, blob in tensors:
        out += _string(name) + struct.pack("<I", len(shape))
        for dim in reversed(shape):
            out += struct.pack("<Q", dim)
        out += struct.pack("<IQ", kind, offset)
        data += blob
        while len(data) % 32:
            data += b"\0"
        offset = len(data)
    while len(out) % 32:
        out += b"\0"
    path = Path(path)
    path.write_bytes(bytes(out + data))
    return path


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.take("<Q")
        text = self.data[self.at : self.at + length].decode("utf-8", errors="surrogateescape")
        self.at += length
        return text

    def value(self, kind: int):
        if kind == T_STRING:
            return self.string()
        if kind == T_ARRAY:
            inner, count = self.take("<I"), self.take("<Q")
            if inner in _SCALARS:
                fmt = _SCALARS[inner]
                values = struct.unpack_from(f"<{count}{fmt[1]}", self.data, self.at)
                self.at += count * struct.calcsize(fmt)
                return list(values)
            return [self.value(inner) for _ in range(count)]
        return self.take(_SCALARS[kind])


def read_metadata(path: str | Path) -> dict:
    reader = _Reader(Path(path).read_bytes())
    if reader.data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    reader.at = 4
    version, _tensors, count = reader.take("<I"), reader.take("<Q"), reader.take("<Q")
    if version != 3:
        raise ValueError(f"{path}: GGUF version {version}, expected 3")
    metadata = {}
    for _ in range(count):
        key = reader.string()
        metadata[key] = reader.value(reader.take("<I"))
    return metadata
