"""The real upstream: device memory from ``cudaMalloc``/``cudaFree`` through CuPy's runtime API."""

from __future__ import annotations

import threading

__all__ = ["CupyUpstream"]

_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation (not exported by cupy to Python)


class CupyUpstream:
    """Segments of GPU ``device_id`` from ``cupy.cuda.runtime.malloc``; ``capacity`` is the
    device's total memory in bytes. A failed cudaMalloc raises ``MemoryError`` so the BFC
    allocator can back off, as it does for any upstream."""

    def __init__(self, device_id: int) -> None:
        import cupy

        self.device_id = device_id
        self._cupy = cupy
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}
        with cupy.cuda.Device(device_id):
            self._capacity = int(cupy.cuda.runtime.memGetInfo()[1])
        self.reserved = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def allocate(self, nbytes: int) -> int:
        runtime = self._cupy.cuda.runtime
        with self._cupy.cuda.Device(self.device_id):
            try:
                address = int(runtime.malloc(nbytes))
            except runtime.CUDARuntimeError as error:
                if getattr(error, "status", None) == _ERROR_MEMORY_ALLOCATION:
                    raise MemoryError(f"cudaMalloc of {nbytes} bytes failed on GPU {self.device_id}") from error
                raise
        with self._lock:
            self._sizes[address] = nbytes
            self.reserved += nbytes
        return address

    def free(self, address: int) -> None:
        with self._lock:
            size = self._sizes.pop(address, None)
        if size is None:
            raise ValueError(f"GPU {self.device_id}: no region starts at {address:#x}")
        with self._cupy.cuda.Device(self.device_id):
            self._cupy.cuda.runtime.free(address)
        with self._lock:
            self.reserved -= size

    def __repr__(self) -> str:
        return f"CupyUpstream(device_id={self.device_id}, capacity={self._capacity})"
