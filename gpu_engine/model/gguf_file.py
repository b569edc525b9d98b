"""A minimal, fast GGUF (v2/v3) reader.

``gguf.GGUFReader`` builds a numpy view per string and takes seconds on a
vocabulary of 50k tokens + 50k merges; this reader parses the header with
``struct`` in ~0.1 s and maps tensor data lazily. It exposes the same
attributes the loaders use: ``fields[key].contents()``, ``tensors[i].name``,
``.shape`` (GGUF order: fastest dimension first), ``.tensor_type``, ``.data``.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
       10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """Not a GGUF file, or a truncated/corrupt one."""


@dataclass
class GGUFField:
    """One metadata value; ``contents()`` returns it (list for arrays)."""

    value: Any

    def contents(self) -> Any:
        return self.value

    @property
    def data(self) -> Any:  # len(field.data) = number of array items, like gguf.ReaderField
        return self.value if isinstance(self.value, list) else [self.value]


@dataclass
class GGUFTensor:
    """A tensor's header and its bytes (read-only numpy view of the mapped file).

    Attributes:
        shape: GGUF order (``ne``: fastest-varying dimension first).
        tensor_type: ``gguf.GGMLQuantizationType``.
        data: F32/F16 → typed array ``[n_elements]``; otherwise uint8 ``[rows, bytes_per_row]``.
    """

    name: str
    shape: tuple[int, ...]
    tensor_type: Any
    data: np.ndarray


class GGUFFile:
    """Parsed GGUF header + memory-mapped tensor data.

    Raises:
        FileNotFoundError: no such file.
        GGUFFormatError: bad magic, unsupported version, or truncated file.
    """

    def __init__(self, path: str | Path) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = Path(path)
        with open(self.path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = self._mm
        if buf[:4] != b"GGUF":
            raise GGUFFormatError(f"{self.path} is not a GGUF file (magic {bytes(buf[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise GGUFFormatError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        self._off = 24
        try:
            self.fields: dict[str, GGUFField] = {}
            for _ in range(n_kv):
                key = self._str()
                (vt,) = self._unpack("<I")
                self.fields[key] = GGUFField(self._value(vt))
            infos = []
            for _ in range(n_tensors):
                name = self._str()
                (nd,) = self._unpack("<I")
                dims = self._unpack(f"<{nd}Q")
                ttype, offset = self._unpack("<IQ")
                infos.append((name, tuple(int(d) for d in dims), ttype, offset))
        except struct.error as e:
            raise GGUFFormatError(f"{self.path}: truncated header ({e})") from None
        align = int(self.fields["general.alignment"].value) if "general.alignment" in self.fields else 32
        data_start = (self._off + align - 1) // align * align
        self.tensors: list[GGUFTensor] = []
        for name, dims, ttype, offset in infos:
            qt = GGMLQuantizationType(ttype)
            n = int(np.prod(dims)) if dims else 1
            block, type_bytes = GGML_QUANT_SIZES[qt]
            nbytes = n // block * type_bytes
            start = data_start + offset
            if start + nbytes > len(buf):
                raise GGUFFormatError(f"{self.path}: tensor {name} runs past the end of the file")
            if qt == GGMLQuantizationType.F32:
                arr = np.frombuffer(buf, dtype=np.float32, count=n, offset=start)
            elif qt == GGMLQuantizationType.F16:
                arr = np.frombuffer(buf, dtype=np.float16, count=n, offset=start)
            else:
                rows = n // dims[0]
                arr = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=start).reshape(rows, nbytes // rows)
            self.tensors.append(GGUFTensor(name, dims, qt, arr))

    # --------------------------------------------------------------- parsing
    def _unpack(self, fmt: str) -> tuple:
        vals = struct.unpack_from(fmt, self._mm, self._off)
        self._off += struct.calcsize(fmt)
        return vals

    def _str(self) -> str:
        (n,) = struct.unpack_from("<Q", self._mm, self._off)
        s = self._mm[self._off + 8: self._off + 8 + n]
        self._off += 8 + n
        return s.decode("utf-8", errors="surrogateescape")

    def _value(self, vt: int) -> Any:
        if vt == _STRING:
            return self._str()
        if vt == _ARRAY:
            et, n = self._unpack("<IQ")
            if et == _STRING:
                return [self._str() for _ in range(n)]
            if et == _ARRAY:
                return [self._value(_ARRAY) for _ in range(n)]
            arr = np.frombuffer(self._mm, dtype=_NP[et], count=n, offset=self._off)
            self._off += arr.nbytes
            return arr.tolist()
        if vt not in _SCALAR:
            raise GGUFFormatError(f"{self.path}: unknown metadata value type {vt}")
        return self._unpack(_SCALAR[vt])[0]

    def close(self) -> None:
        """Drop the mapping (tensor ``data`` arrays must not be used afterwards)."""
        self.tensors.clear()
        try:
            self._mm.close()
        except BufferError:  # arrays still reference it; the GC closes it later
            pass
