"""cuda-python helpers for the engine: events, host registration, graph launch.

Everything here imports ``cuda.bindings.runtime`` lazily (first call), so the
package imports on machines without CUDA or cuda-python (CI). See
:mod:`gpu_engine.cuda.runtime`.
"""
from gpu_engine.cuda.runtime import (
    CudaError,
    Event,
    HostRegistration,
    available,
    graph_exec_handle,
    launch_graph,
    memcpy_h2d_async,
)

__all__ = ["CudaError", "Event", "HostRegistration", "available", "graph_exec_handle", "launch_graph",
           "memcpy_h2d_async"]
