"""Client of the constraint sidecar: process supervision, Prepare, and the Step stream.

The engine never imports :mod:`constraint_service`; it talks to it only over
``ninfer.constraint.v1`` (gRPC on a unix socket) and the shared-memory mask ring.
"""
from gpu_engine.sidecar.client import PrepareInfo, RowStatus, Sidecar, SidecarUnavailable, StepRow, StepRowResult

__all__ = ["PrepareInfo", "RowStatus", "Sidecar", "SidecarUnavailable", "StepRow", "StepRowResult"]
