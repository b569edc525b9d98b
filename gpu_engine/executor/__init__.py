"""Executors (model runners): run the forward pass and the sampler for one step's rows.

:class:`~gpu_engine.executor.eager.Program` runs eagerly (CPU, or CUDA without graphs);
:class:`~gpu_engine.executor.cuda_graph.CudaProgram` replays captured CUDA graphs per batch
bucket. :func:`make_program` picks one for a loaded model.
"""
from __future__ import annotations

from gpu_engine.executor.eager import Program

__all__ = ["Program", "make_program"]


def make_program(loaded, ring, cuda_graphs: str = "auto") -> Program:
    """The Program for a loaded model: CUDA (graphs, cuda-python events, pinned ring) or eager CPU.

    Args:
        loaded: a :class:`gpu_engine.model.loader.LoadedModel`.
        ring: the engine's :class:`shared_memory.ring.MaskRing` (registered as
            pinned host memory on CUDA).
        cuda_graphs: ``"auto"`` (on when CUDA), ``"on"`` or ``"off"`` (CUDA: same static
            buffers and phases, run eagerly).
    """
    dev = loaded.model.device
    if dev.type == "cuda":
        from gpu_engine.executor.cuda_graph import CudaProgram  # lazy: cuda-python only where CUDA runs

        return CudaProgram(loaded.model, loaded.vocab.vocab_size, dev, ring, use_graphs=cuda_graphs != "off")
    return Program(loaded.model, loaded.vocab.vocab_size, dev)
