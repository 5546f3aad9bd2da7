"""`shardctl serve --workers N`: N uvicorn servers on one port, each on a listening socket of its own.

uvicorn's own supervisor binds one socket and hands it to every worker. Whichever worker wakes first
accepts every connection that is waiting, so clients that open keep-alive connections together all
land on one worker while the others idle, and the throughput and p99 are one worker's: 16 connections
opened at once against two workers split 16/0 in three tries of five (15/1 and 10/6 in the others).
Here each worker binds a socket of its own with SO_REUSEPORT, and the kernel spreads new connections
over them by a hash of their addresses (7/9, 6/10, 6/10, 6/10, 7/9 in the same tries).

The parent process supervises: it starts the workers, starts another when one that served dies, stops
them all when one dies before it served (the app, the database or the port is wrong, and would be
again for the next), and on SIGTERM or SIGINT passes SIGTERM on and waits. A worker then closes its
socket, finishes the requests in flight (uvicorn's `timeout_graceful_shutdown`) and exits 0; it does
the same when the parent dies, even by SIGKILL (Linux). Unlike uvicorn's supervisor it does not ping
workers to kill hung ones, nor take SIGHUP, SIGTTIN or SIGTTOU.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from types import FrameType
from typing import Any

import uvicorn

from service.cli.connections import ConnectionLimits, guarded_protocol

log = logging.getLogger(__name__)

#: How often the parent looks at its workers.
CHECK_S = 0.5
#: How long a worker may take to exit after its grace, before it is killed.
KILL_AFTER_S = 10.0
#: Linux's prctl option: a signal for this process when its parent dies.
PR_SET_PDEATHSIG = 1


class PortInUse(Exception):
    """Something already listens on the address serve was asked to bind."""


def _bound_socket(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def check_port_free(host: str, port: int) -> None:
    """Raises `PortInUse` when another socket (another server, another serve) holds `host`:`port`:
    workers bind with SO_REUSEPORT, which would otherwise let them share the port with another serve
    of the same user without an error."""
    try:
        _bound_socket(host, port, reuse_port=False).close()
    except OSError as exc:
        raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror or exc}; stop what uses that port,"
                        " or choose another with --port") from None


class _Server(uvicorn.Server):
    """uvicorn's server, telling the parent once it serves."""

    def __init__(self, config: uvicorn.Config, serving: Event) -> None:
        super().__init__(config)
        self.serving = serving

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.serving.set()


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)


def _die_with(parent: int) -> None:
    """SIGTERM to this worker when serve's process dies, even by SIGKILL (the OOM killer), so that no
    orphaned worker keeps serving on the port while a new serve cannot bind it. Linux only; elsewhere
    nothing is set up."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before prctl took effect
        sys.exit(0)


def _worker(app: str, host: str, port: int, options: dict[str, Any], limits: ConnectionLimits | None,
            serving: Event, parent: int) -> None:
    # uvicorn raises the signal it stopped on again once it has shut down, under the handler that was
    # there before it started: this one, so a worker that stopped gracefully exits 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    signal.signal(signal.SIGINT, _exit_cleanly)
    _die_with(parent)
    try:
        sock = _bound_socket(host, port, reuse_port=True)
    except OSError as exc:
        log.error("worker cannot bind %s:%d: %s", host, port, exc)
        sys.exit(1)
    if limits is not None:
        options = {**options, "http": guarded_protocol(limits)}
    _Server(uvicorn.Config(app, host=host, port=port, **options), serving).run(sockets=[sock])


def serve_workers(app: str, *, workers: int, host: str, port: int, limits: ConnectionLimits | None = None,
                  **options: Any) -> int:
    """Serve the import string `app` (with uvicorn `options`: `factory`, timeouts, logging) from
    `workers` processes on `host`:`port` until SIGTERM or SIGINT, each worker holding its connections
    within `limits` (`service.cli.connections`; None: uvicorn's own protocol, unbounded); returns the
    exit status: 0 after a graceful stop, 1 when a worker died before it served (its error is in the
    log). Raises `PortInUse` before starting any worker when the port is taken. Workers are started
    with `spawn`, so they inherit the environment, not the parent's state."""
    check_port_free(host, port)
    context = multiprocessing.get_context("spawn")
    stopping = threading.Event()
    running: list[tuple[BaseProcess, Event]] = []

    def start() -> tuple[BaseProcess, Event]:
        serving = context.Event()
        process = context.Process(target=_worker, args=(app, host, port, options, limits, serving, os.getpid()),
                                  name="shardctl-api-worker", daemon=False)
        process.start()
        return process, serving

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        running.extend(start() for _ in range(workers))
        while not stopping.wait(CHECK_S):
            for index, (process, serving) in enumerate(running):
                if process.is_alive():
                    continue
                if not serving.is_set():
                    log.error("API worker %s exited with %s before it served; stopping", process.pid,
                              process.exitcode)
                    status = 1
                    stopping.set()
                    break
                log.warning("API worker %s died (exit %s); starting another", process.pid, process.exitcode)
                running[index] = start()
    finally:
        _stop(running, float(options.get("timeout_graceful_shutdown") or 0))
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status


def _stop(running: list[tuple[BaseProcess, Event]], grace_s: float) -> None:
    for process, _ in running:
        if process.is_alive():
            process.terminate()  # SIGTERM: the worker drains, then exits
    deadline = time.monotonic() + grace_s + KILL_AFTER_S
    for process, _ in running:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            log.error("API worker %s did not stop within its grace; killing it", process.pid)
            process.kill()
            process.join()
