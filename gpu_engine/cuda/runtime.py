"""Thin, checked wrappers over ``cuda.bindings.runtime`` (cuda-python).

What the engine does through cuda-python (DESIGN.md "Shape of the system"):

* **events** — :class:`Event`: ``cudaEventCreateWithFlags``, ``cudaEventRecord``,
  ``cudaEventQuery``, ``cudaEventSynchronize`` (the event the CPU waits on
  before it reads a step's tokens), ``cudaEventElapsedTime`` (phase timing);
* **host registration** — :class:`HostRegistration`: ``cudaHostRegister`` of
  the whole shared-memory mask ring (page-locked, portable), so one
  ``cudaMemcpyAsync`` (:func:`memcpy_h2d_async`) moves a ring slot to the
  device on the compute stream; ``cudaHostUnregister`` before the ring is
  unmapped;
* **graph launch** — :func:`launch_graph`: ``cudaGraphLaunch`` of the
  executable graph a ``torch.cuda.CUDAGraph`` instantiated (torch captures
  the kernels; the launch skips torch's replay bookkeeping).

The module imports ``cuda.bindings`` on first use only, so importing it on a
machine without CUDA (CI) costs nothing. Every call's return code is checked;
a failure raises :class:`CudaError` naming the call and the error.
"""
from __future__ import annotations

from typing import Any

__all__ = ["CudaError", "Event", "HostRegistration", "available", "graph_exec_handle", "launch_graph",
           "memcpy_h2d_async"]

_rt: Any = None


class CudaError(RuntimeError):
    """A CUDA runtime call failed (message: call name and cudaError_t name)."""


def _runtime() -> Any:
    """The ``cuda.bindings.runtime`` module (imported once). Raises CudaError when missing."""
    global _rt
    if _rt is None:
        try:
            from cuda.bindings import runtime as rt
        except ImportError:  # older cuda-python layout
            try:
                from cuda import cudart as rt  # type: ignore[no-redef]
            except ImportError as e:
                raise CudaError("cuda-python (cuda.bindings.runtime) is not installed") from e
        _rt = rt
    return _rt


def available() -> bool:
    """True when cuda-python imports and reports at least one device (never raises)."""
    try:
        rt = _runtime()
        err, n = rt.cudaGetDeviceCount()
        return err == rt.cudaError_t.cudaSuccess and n > 0
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return False


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda-python result tuple ``(err, *values)``; raise on error."""
    rt = _runtime()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != rt.cudaError_t.cudaSuccess:
        name = getattr(err, "name", str(err))
        raise CudaError(f"{what} failed: {name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


class Event:
    """A CUDA event.

    Args:
        timing: keep timing (needed for :meth:`elapsed_ms`); ``False`` creates it
            with ``cudaEventDisableTiming`` (cheaper record/wait).

    Raises:
        CudaError: creation failed (no device, no cuda-python).
    """

    def __init__(self, timing: bool = True) -> None:
        rt = _runtime()
        flags = rt.cudaEventDefault if timing else rt.cudaEventDisableTiming
        self._ev = _check(rt.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags")
        self.timing = timing

    def record(self, stream: int) -> None:
        """Record on ``stream`` (a raw ``cudaStream_t`` as int, e.g. ``torch_stream.cuda_stream``)."""
        _check(_runtime().cudaEventRecord(self._ev, stream), "cudaEventRecord")

    def query(self) -> bool:
        """True when all work before the record has completed (``cudaEventQuery``; no wait)."""
        rt = _runtime()
        (err,) = rt.cudaEventQuery(self._ev)
        if err == rt.cudaError_t.cudaSuccess:
            return True
        if err == rt.cudaError_t.cudaErrorNotReady:
            return False
        raise CudaError(f"cudaEventQuery failed: {getattr(err, 'name', err)}")

    def synchronize(self) -> None:
        """Block the calling CPU thread until the event completes (``cudaEventSynchronize``)."""
        _check(_runtime().cudaEventSynchronize(self._ev), "cudaEventSynchronize")

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (both recorded and completed, both timing events)."""
        rt = _runtime()
        fn = getattr(rt, "cudaEventElapsedTime", None) or getattr(rt, "cudaEventElapsedTime_v2")
        return float(_check(fn(self._ev, end._ev), "cudaEventElapsedTime"))

    def destroy(self) -> None:
        """Release the event (idempotent)."""
        if self._ev is not None:
            _check(_runtime().cudaEventDestroy(self._ev), "cudaEventDestroy")
            self._ev = None


class HostRegistration:
    """Page-locks an existing host range (``cudaHostRegister``) until :meth:`unregister`.

    Used for the whole shared-memory mask ring, so async copies from any slot
    are true DMA transfers ordered on the compute stream.

    Args:
        address: start of the range in this process (the ring's mapping base, page-aligned).
        nbytes: length in bytes.
        portable: ``cudaHostRegisterPortable`` (pinned for every CUDA context) in
            addition to ``cudaHostRegisterDefault``.

    Raises:
        CudaError: registration failed (e.g. the memory cannot be locked).
    """

    def __init__(self, address: int, nbytes: int, portable: bool = True) -> None:
        rt = _runtime()
        flags = rt.cudaHostRegisterDefault | (rt.cudaHostRegisterPortable if portable else 0)
        _check(rt.cudaHostRegister(address, nbytes, flags), "cudaHostRegister")
        self.address, self.nbytes = int(address), int(nbytes)
        self._registered = True

    def unregister(self) -> None:
        """``cudaHostUnregister`` (idempotent). Call before the memory is unmapped."""
        if self._registered:
            self._registered = False
            _check(_runtime().cudaHostUnregister(self.address), "cudaHostUnregister")


def memcpy_h2d_async(dst_ptr: int, src_ptr: int, nbytes: int, stream: int) -> None:
    """``cudaMemcpyAsync`` host → device of ``nbytes`` on ``stream``.

    ``src_ptr`` should lie in registered (page-locked) memory; otherwise the
    copy is staged by the driver and is not asynchronous. Raises CudaError.
    """
    rt = _runtime()
    _check(rt.cudaMemcpyAsync(dst_ptr, src_ptr, nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream),
           "cudaMemcpyAsync")


def graph_exec_handle(graph: Any) -> int | None:
    """The ``cudaGraphExec_t`` (as int) of an instantiated ``torch.cuda.CUDAGraph``, or None
    when this torch has no ``raw_cuda_graph_exec`` (then use ``graph.replay()``)."""
    fn = getattr(graph, "raw_cuda_graph_exec", None)
    if fn is None:
        return None
    try:
        return int(fn())
    except Exception:  # noqa: BLE001 - older torch: not instantiated / unsupported
        return None


def launch_graph(exec_handle: int, stream: int) -> None:
    """``cudaGraphLaunch`` of an executable graph on ``stream``. Raises CudaError."""
    _check(_runtime().cudaGraphLaunch(exec_handle, stream), "cudaGraphLaunch")
