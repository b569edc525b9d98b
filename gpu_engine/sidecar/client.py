"""Supervision of the constraint sidecar and the client side of its API.

The engine starts ``python -m constraint_service`` as a child process on a
unix socket inside a fresh private directory (mode 0700, random name: no other
user can place or reach a socket there), checks with ``SO_PEERCRED`` that the
process answering on it is that child (same uid), registers its vocabulary
and mask ring, and keeps one ``Step``
stream open (:class:`gpu_engine.sidecar.stream.StepStream`: every answer has a deadline).
Every restart begins a new *generation*: sessions live in one generation only. Under
``ninfer serve`` a :class:`gpu_engine.sidecar.supervisor.SidecarSupervisor` watches the
process (heartbeat, deadlines) and restarts it off the engine thread; the engine re-prepares
its live constrained requests and replays their committed tokens
(:mod:`gpu_engine.engine.supervision`).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ninfer.constraint.v1 import constraint_pb2 as pb
from ninfer.constraint.v1 import constraint_pb2_grpc as pb_grpc
from ninfer_common.grpc_status import detail_from_rpc_error
from ninfer_common.telemetry import instrument_channel

from ninfer_common.errors import ErrorKind, RequestError, RowError, Status
from gpu_engine.core.request import CacheStatus
from gpu_engine.model.vocab import TokenVocabulary
from gpu_engine.sidecar.launch import (PRIVATE_DIR_PREFIX, STEP_SWITCH_INTERVAL_S, SidecarUnavailable, socket_served_by,
                                      sweep_stale_private_dirs, wait_until_serving)
from gpu_engine.sidecar.rows import PrepareInfo, RowStatus, StepRow, StepRowResult, step_request, step_results
from gpu_engine.sidecar.stream import SocketStepStream, StepSocketRefused, StepStream, StreamBroken
from ninfer_common.step_socket import STEP_TRANSPORTS, step_socket_path

__all__ = ["PRIVATE_DIR_PREFIX", "PrepareInfo", "RowStatus", "Sidecar", "SidecarUnavailable", "StepRow",
           "StepRowResult", "sweep_stale_private_dirs"]

_CACHE = {pb.CACHE_STATUS_HIT: CacheStatus.HIT, pb.CACHE_STATUS_BUILT: CacheStatus.BUILT,
          pb.CACHE_STATUS_WAITED: CacheStatus.WAITED}

log = logging.getLogger("ninfer.engine.sidecar")


def _detail_from_error(err: grpc.RpcError) -> tuple[str, str, str]:
    """(kind, message, location) from a sidecar error's ``ConstraintErrorDetail`` (plain status text if none)."""
    det = detail_from_rpc_error(err, pb.ConstraintErrorDetail)
    if det is None or det.kind not in ErrorKind.__members__.values():
        return ErrorKind.CONSTRAINT_ERROR, (det.message if det is not None else "") or err.details() or str(err), ""
    return ErrorKind(det.kind), det.message, det.location


class Sidecar:
    """Owns the sidecar process, its channel and the Step stream.

    Args:
        socket_path: unix socket path for the sidecar, or ``None`` (the default in ``ninfer serve``):
            a socket in a fresh private directory made by :func:`tempfile.mkdtemp` (0700), removed
            by :meth:`stop`.
        vocab: the model's token domain to register.
        ring_info: ``AttachRingRequest`` fields (name, byte_size, num_slots,
            num_lanes, num_positions, num_words).
        extra_args: extra command-line arguments for the sidecar.
        external: connect to a sidecar supervised by someone else (a Kubernetes sidecar container)
            at ``socket_path`` instead of starting a child: the peer must run under our uid; a lost
            connection is re-established (re-registering vocabulary and ring) by the supervisor, never killed.
        step_deadline_s: seconds the engine waits for one Step answer before it treats the sidecar as
            hung (:meth:`recv_step`); also the heartbeat deadline of the supervisor.
        prepare_timeout_s: gRPC deadline of one ``Prepare`` (compile timeout plus a margin).
        step_transport: ``"socket"`` (default): the Step stream on the sidecar's local step socket
            (:mod:`ninfer_common.step_socket`), falling back to gRPC when the sidecar has none;
            ``"grpc"``: always the gRPC ``Step`` RPC.

    Raises:
        ValueError: an unknown ``step_transport``, or ``external`` without a ``socket_path``.
    """

    def __init__(self, socket_path: str | None, vocab: TokenVocabulary, ring_info: dict,
                 extra_args: list[str] | None = None, startup_timeout_s: float = 60.0, external: bool = False,
                 step_deadline_s: float = 30.0, prepare_timeout_s: float = 60.0,
                 step_transport: str = "socket") -> None:
        if external and not socket_path:
            raise ValueError("external: expected a socket_path")
        if step_transport not in STEP_TRANSPORTS:
            raise ValueError(f"step_transport: expected one of {STEP_TRANSPORTS}, got {step_transport!r}")
        self.step_transport = step_transport
        self.external = external
        self._lost = False
        self._private_dir: str | None = None
        if socket_path is None:
            sweep_stale_private_dirs()
            # mode 0700, unpredictable name; our pid in it proves the directory stale once we are dead
            self._private_dir = tempfile.mkdtemp(prefix=f"{PRIVATE_DIR_PREFIX}{os.getpid()}-")
            socket_path = os.path.join(self._private_dir, "constraint.sock")
        self.socket_path = socket_path
        self.vocab = vocab
        self.ring_info = ring_info
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.step_deadline_s = step_deadline_s
        self.prepare_timeout_s = prepare_timeout_s
        self.generation = 0
        self._lock = threading.RLock()
        self._proc: subprocess.Popen | None = None
        self._channel: grpc.Channel | None = None
        self._probe: grpc.Channel | None = None  # heartbeats: a plain channel (no spans per probe)
        self._stub: pb_grpc.ConstraintServiceStub | None = None
        self._stream: StepStream | None = None
        self._sent_on: StepStream | None = None  # the stream of the last send_step (its answer comes there)
        self.restarts = 0
        self.supervisor = None  # a SidecarSupervisor once supervised: restarts happen on its thread

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start (or restart) the sidecar and register vocabulary and ring.

        Raises:
            SidecarUnavailable: it did not become healthy within the timeout.
        """
        with self._lock:
            self._stop_locked()
            if not self.external:
                cmd = [sys.executable, "-m", "constraint_service", "--socket", self.socket_path,
                       "--parent-pid", str(os.getpid()), *self.extra_args]
                # Its own session: a terminal's Ctrl-C (SIGINT to the foreground process group) reaches only
                # the engine, which stops the sidecar itself. Before, the sidecar exited on it too, mid-shutdown,
                # and the supervisor restarted it (the parent-death signal still covers a dying engine).
                self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                              start_new_session=True)
            target = f"unix://{self.socket_path}"
            # Start-up health polls use a plain channel: the first ones fail by design while the
            # sidecar boots, and must not export ERROR spans (issue 14 (9)).
            probe = grpc.insecure_channel(target)
            try:
                pid = None if self.external else self._proc.pid
                wait_until_serving(probe, self._proc, lambda: socket_served_by(self.socket_path, pid),
                                   self.startup_timeout_s)
            except BaseException:
                probe.close()
                raise
            channel = instrument_channel(grpc.insecure_channel(target, options=[("grpc.max_send_message_length",
                                                                                 64 << 20)]))
            stub = pb_grpc.ConstraintServiceStub(channel)
            v = self.vocab
            try:
                stub.RegisterVocabulary(pb.RegisterVocabularyRequest(
                    vocab_size=v.vocab_size, token_bytes=list(v.token_bytes), special_ids=sorted(v.special_ids),
                    eos_ids=list(v.eos_ids)), timeout=60)
                stub.AttachRing(pb.AttachRingRequest(**self.ring_info), timeout=30)
            except grpc.RpcError as e:
                channel.close()
                probe.close()
                raise SidecarUnavailable(f"registering with the sidecar failed ({e.code().name})") from None
            self._channel, self._stub, self._probe = channel, stub, probe
            self.generation += 1
            try:
                self._stream = self._open_step_stream(stub)
            except StepSocketRefused as e:
                channel.close()
                probe.close()
                raise SidecarUnavailable(f"{e}; refusing to use it") from None
            self._lost = False
            if sys.getswitchinterval() > STEP_SWITCH_INTERVAL_S:
                sys.setswitchinterval(STEP_SWITCH_INTERVAL_S)

    def _open_step_stream(self, stub) -> "SocketStepStream | StepStream":
        """The Step stream of the generation just started: on the step socket when asked and served, else gRPC.

        Raises:
            StepSocketRefused: the step socket is served by another process or user.
        """
        if self.step_transport == "socket":
            path = step_socket_path(self.socket_path)
            try:
                return SocketStepStream(path, self.generation, self.step_deadline_s,
                                        None if self.external else self._proc.pid)
            except OSError as e:
                log.info("no local Step socket at %s (%s); the Step stream uses gRPC", path, e)
        return StepStream(stub, self.generation, self.step_deadline_s)

    @property
    def step_stream_transport(self) -> str | None:
        """The transport of the current Step stream (``"socket"`` or ``"grpc"``), None when there is none."""
        stream = self._stream
        return stream.transport if stream is not None else None

    def _stop_locked(self, hard: bool = False) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        for ch in (self._channel, self._probe):
            if ch is not None:
                ch.close()
        self._channel = self._probe = None
        if self._proc is not None and self._proc.poll() is None:
            if hard:  # hung (maybe SIGSTOPped): SIGTERM would wait; SIGKILL works on a stopped process
                self._proc.kill()
            else:
                self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        self._stub = None

    def stop(self) -> None:
        """Stop the sidecar process (SIGTERM, then SIGKILL after 5 s) and remove its private directory."""
        with self._lock:
            self._stop_locked()
            if self._private_dir is not None:
                shutil.rmtree(self._private_dir, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        """PID of the sidecar process, or None."""
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        """True while the sidecar process runs and its connection has not failed (a broken Step
        stream cannot be resumed: a live child behind one is restarted by :meth:`ensure_started`)."""
        if self.external:
            return self._stub is not None and not self._lost
        return self._proc is not None and self._proc.poll() is None and not self._lost

    def ensure_started(self) -> None:
        """Restart the sidecar (on the calling thread) if its process died or its connection broke.

        For unsupervised use (tools, benches, tests); a supervised sidecar restarts on the
        supervisor's thread (:meth:`restart`).
        """
        with self._lock:
            if not self.alive():
                self.restart("not running")

    def restart(self, why: str) -> None:
        """Kill the current sidecar (SIGKILL: it may be hung) or drop the connection to an external one,
        then start a fresh generation.

        Raises:
            SidecarUnavailable: the new sidecar did not become healthy.
        """
        with self._lock:
            log.warning("constraint sidecar lost (%s); %s (restart #%d)", why,
                        "reconnecting" if self.external else "restarting", self.restarts + 1)
            self._lost = True
            self._stop_locked(hard=True)
            self.start()
            self.restarts += 1

    def mark_lost(self, why: str, generation: int | None = None) -> None:
        """Record that the connection failed (a broken stream, a missed deadline); wakes the supervisor.
        A report about an older ``generation`` than the current one is ignored (already replaced)."""
        if generation is not None and generation != self.generation:
            return
        self._lost = True
        if self._stream is not None and not self._stream.broken:
            self._stream.broken = why
        if self.supervisor is not None:
            self.supervisor.wake()

    def check_health(self, timeout_s: float) -> str:
        """Heartbeat: ``""`` when the sidecar is alive and answers ``grpc.health.v1`` within ``timeout_s``,
        else why not (a plain-text reason)."""
        if self._proc is not None and self._proc.poll() is not None:
            return f"the sidecar exited with code {self._proc.returncode}"
        if self._lost:
            return (self._stream.broken if self._stream is not None and self._stream.broken else
                    "the connection failed")
        probe = self._probe
        if probe is None:
            return "not started"
        try:
            r = health_pb2_grpc.HealthStub(probe).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError as e:
            return f"health check failed ({e.code().name})"
        except ValueError:  # the channel was closed by a concurrent restart
            return "the connection was closed"
        return "" if r.status == health_pb2.HealthCheckResponse.SERVING else "the sidecar reports NOT_SERVING"

    # ------------------------------------------------------------------- RPCs
    def prepare(self, request_id: str, kind: str, source: str, choices: list[str], prefix: bytes,
                wrapper: str = "", replace: bool = False) -> PrepareInfo:
        """Compile the constraint and create the request's output session (gRPC deadline
        ``prepare_timeout_s``; a missed deadline marks the sidecar lost).

        ``wrapper`` is the model output wrapper (thinking stage / tool calls) as the output plan's canonical
        JSON (``OutputPlan.grammar_key()``); ``kind`` may then be ``""`` (no body constraint).
        ``replace``: a session of ``request_id`` left in the sidecar (a reconnect to the same external
        sidecar) is closed first instead of refused (re-preparing after a lost connection).

        Raises:
            RequestError: the constraint is invalid (kind/location from the sidecar),
                or the sidecar is unavailable (code UNAVAILABLE).
        """
        for attempt in range(3):
            try:
                self._wait_usable()
                stub, gen = self._stub, self.generation
                if stub is None:
                    raise SidecarUnavailable("the sidecar is not connected")
                r = stub.Prepare(pb.PrepareRequest(request_id=request_id, prefix=prefix,
                                                   constraint=pb.Constraint(kind=kind, source=source, choices=choices,
                                                                            wrapper=wrapper)),
                                 timeout=self.prepare_timeout_s)
                return PrepareInfo(_CACHE.get(r.cache, CacheStatus.BUILT), r.prepare_seconds, gen)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    k, m, loc = _detail_from_error(e)
                    raise RequestError(k, m, loc) from None
                if e.code() == grpc.StatusCode.ALREADY_EXISTS:
                    if replace and attempt < 2:
                        try:
                            stub.Close(pb.CloseRequest(request_id=request_id), timeout=self.step_deadline_s)
                        except grpc.RpcError:
                            pass
                        continue
                    raise RequestError("InvalidRequest", f"request_id {request_id!r} is already in use by a "
                                       "running request") from None
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    self.mark_lost(f"Prepare gave no answer within {self.prepare_timeout_s:g} s", gen)
                    if attempt == 0:
                        continue
                    raise RequestError("ConstraintServiceUnavailable", "the constraint sidecar did not answer "
                                       f"Prepare within {self.prepare_timeout_s:g} s",
                                       status=Status.UNAVAILABLE) from None
                if self.external and attempt == 0 and e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    # gRPC reconnected by itself to a replaced sidecar that has no vocabulary or ring
                    # yet ("RegisterVocabulary must come first"): register again, then retry once.
                    self.mark_lost("the sidecar lost its registration", gen)
                    continue
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    self.mark_lost(f"Prepare failed ({e.code().name})", gen)
                    if attempt == 0:
                        continue
                    raise RequestError("ConstraintServiceUnavailable", f"constraint sidecar unavailable: "
                                       f"{e.details()}", status=Status.UNAVAILABLE) from None
                raise RequestError("ConstraintServiceError", f"constraint sidecar failed: {e.code().name}: "
                                   f"{e.details()}", status=Status.INTERNAL) from None
            except SidecarUnavailable as e:
                raise RequestError("ConstraintServiceUnavailable", str(e), status=Status.UNAVAILABLE) from None
        raise RequestError("ConstraintServiceUnavailable", "the constraint sidecar is unavailable",
                           status=Status.UNAVAILABLE)

    def _wait_usable(self) -> None:
        """Supervised: wait (bounded) until the supervisor has the sidecar up; else restart it here.

        Raises:
            SidecarUnavailable: it is down and could not be restarted in time.
        """
        if self.supervisor is None:
            self.ensure_started()
        elif not self.supervisor.wait_up(self.startup_timeout_s):
            raise SidecarUnavailable(self.supervisor.down_reason or "the constraint sidecar is down")

    def close(self, request_id: str, final_tokens: list[int], generation: int) -> tuple[bool, bool, int, str]:
        """End a session with a blocking ``Close`` RPC: returns ``(complete, terminated, mask_positions, error)``.

        For tools and benches (``bench/mask_bench.py``); the engine never blocks on it: it
        closes sessions on the Step stream (:class:`StepRow` with ``close``).

        Raises:
            RowError: the sidecar died (the session is gone).
        """
        if generation != self.generation or self._stub is None:
            raise RowError("ConstraintServiceUnavailable", "the constraint sidecar restarted; session lost",
                           status=Status.UNAVAILABLE)
        try:
            r = self._stub.Close(pb.CloseRequest(request_id=request_id, final_tokens=final_tokens), timeout=30)
        except grpc.RpcError as e:
            raise RowError("ConstraintServiceUnavailable", f"Close failed: {e.code().name}", status=Status.UNAVAILABLE) from None
        return r.complete, r.terminated, r.mask_positions, r.error

    def send_step(self, step_seq: int, slot: int, rows: list[StepRow], generation: int | None = None) -> None:
        """Send one Step message (non-blocking).

        Raises:
            SidecarUnavailable: no usable stream, or the sidecar is not of ``generation`` any more (its
                sessions are gone: rows of an older generation must be re-prepared first).
        """
        stream = self._stream
        if stream is None or self._lost or (generation is not None and stream.generation != generation):
            raise SidecarUnavailable("no Step stream" if stream is None or self._lost else
                                     f"the sidecar restarted (generation {stream.generation}, rows of {generation})")
        msg = step_request(step_seq, slot, rows)
        try:
            stream.send(msg)
        except StreamBroken as e:
            self.mark_lost(str(e), stream.generation)
            raise SidecarUnavailable(f"Step stream broke ({e})") from None
        self._sent_on = stream

    def drain_step(self) -> tuple[list[StepRowResult], float] | None:
        """Read the answer of the last Step sent if it is still outstanding (its sender gave up on it: the engine
        step failed after sending it), so the next answer read is the next Step's; returns it as
        :meth:`recv_step` does, or None when none was outstanding or it could not be read (the stream is then
        marked lost and the supervisor restarts the sidecar)."""
        stream, self._sent_on = self._sent_on, None
        if stream is None:
            return None
        try:
            r = stream.recv()
        except StreamBroken as e:
            self.mark_lost(str(e), stream.generation)
            return None
        return step_results(r), r.work_seconds

    def recv_step(self, step_seq: int, timeout: float | None = None) -> tuple[list[StepRowResult], float] | None:
        """Wait (at most ``step_deadline_s`` since the first wait) for the answer to ``step_seq``: per-row
        results and sidecar work seconds.

        Args:
            timeout: ``None`` blocks until the answer or the deadline; else a soft budget in seconds
                (``0`` polls): ``None`` is returned when it passes first and the answer stays
                outstanding (ask again with the same ``step_seq``; send no Step meanwhile).

        Raises:
            SidecarUnavailable: the stream broke (sidecar died), no answer came within the deadline
                (hung: the sidecar is then marked lost, and the supervisor kills and restarts it), or
                it answered out of order.
        """
        stream = self._sent_on
        if stream is None:
            raise SidecarUnavailable("no Step was sent")
        try:
            r = stream.recv(timeout)
        except StreamBroken as e:
            self._sent_on = None
            self.mark_lost(str(e), stream.generation)
            raise SidecarUnavailable(f"Step stream broke ({e})") from None
        if r is None:
            return None
        self._sent_on = None
        if r.step_seq != step_seq:
            stream.broken = "answers out of order"
            self.mark_lost(stream.broken, stream.generation)
            raise SidecarUnavailable(f"Step answer out of order: expected seq {step_seq}, got {r.step_seq}")
        return step_results(r), r.work_seconds
