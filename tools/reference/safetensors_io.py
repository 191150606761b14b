"""Safetensors reading/writing and BF16 rounding with NumPy only.

The format: an 8-byte little-endian header length, a JSON header mapping each name to
{dtype, shape, data_offsets} (offsets relative to the end of the header), then the payloads.
"""
import json
import os
import struct

import numpy as np

_NP = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def bf16_bits_to_f32(bits):
    """uint16 BF16 bit patterns -> float32 (exact: BF16 is the top half of an F32)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def round_bf16(x):
    """Round to the nearest BF16 value, ties to even, returned as float64.

    The value is first taken to F32 (the reference computes in F32 and rounds the F32 result to
    BF16: PyTorch's `.to(bfloat16)`), then the low 16 bits are rounded away. Not NaN-safe (the
    model has no NaNs)."""
    u = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def f32_to_bf16_bits(x):
    """float values that are BF16-representable -> their uint16 bit patterns (checked)."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32)
    if np.any(u & 0xFFFF):
        raise ValueError("value is not BF16-representable")
    return (u >> 16).astype(np.uint16)


def read_file(path):
    """All tensors of one .safetensors file: name -> ndarray (BF16 widened to float32)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        raw = data[b:e]
        if meta["dtype"] == "BF16":
            arr = bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2"))
        elif meta["dtype"] in _NP:
            arr = np.frombuffer(raw, dtype=np.dtype(_NP[meta["dtype"]]).newbyteorder("<")).copy()
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {meta['dtype']}")
        out[name] = arr.reshape(meta["shape"])
    return out


def read_metadata(path):
    """The `__metadata__` map of a .safetensors file ({} when absent)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def read_checkpoint(directory):
    """Every tensor of a sharded checkpoint (model.safetensors.index.json) or one model.safetensors."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    tensors = {}
    for s in shards:
        tensors.update(read_file(os.path.join(directory, s)))
    return tensors


def write_file(path, tensors, metadata=None):
    """tensors: name -> (dtype string, ndarray). Names are written in sorted order."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        if dtype == "BF16":
            raw = f32_to_bf16_bits(arr).astype("<u2").tobytes()
        else:
            raw = np.ascontiguousarray(arr, dtype=np.dtype(_NP[dtype]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(arr)), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)
