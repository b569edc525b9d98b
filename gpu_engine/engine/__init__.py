"""The scheduler: admission of queued requests into lanes and the step loop (continuous batching)."""
from gpu_engine.engine.loop import Engine
from gpu_engine.engine.stats import EngineStats, ring_geometry

__all__ = ["Engine", "EngineStats", "ring_geometry"]
