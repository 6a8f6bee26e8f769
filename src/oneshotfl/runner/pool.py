"""Clients in parallel: the in-process transport's steps, run in worker processes.

:class:`PoolTransport` runs every client's :func:`~oneshotfl.runner.transport.client_step`
(and every peer receiver's :func:`~oneshotfl.runner.transport.peer_step`) in one of
``workers`` processes holding the parent's prepared federation — the same data, encoder and
seeds. With one thread per client step (``client_threads=1``, the default) on a machine where
torch sees no GPU they are forked: they start at once, share the parent's memory until they
write, and do not re-run the calling script. A fork is not safe everywhere
(:func:`start_method`): a forked process must not use OpenMP threads (torch's would hang),
and where torch sees a GPU the autograd engine has started device threads at the parent's
first backward pass (the SimCLR encoder, a server-side step), after which no forked child can
train. So with more threads per step, or wherever an accelerator is visible, the workers come
from a ``forkserver`` and are handed a copy of the federation; a script that runs oneshotfl
then needs Python's ``if __name__ == "__main__":`` guard, as every multiprocessing program
started that way does. Client ``k``
always runs in worker ``k mod workers``: its in-memory artefacts (a model trained without a
disk cache, memoised accuracies) stay where it made them, for the next method of the run.

Every step runs at the config's ``client_threads`` — as the in-process transport's and a
Flower node's do — so the result is bit-identical for any number of workers. What is not
parallel stays in the parent: the server's aggregation, evaluation, and the order in which
replies reach the engine (client-id order). A client whose step raises is named and left out,
as in process; a worker that dies names each client it still held and is replaced before the
next step. A method that cannot be sent to a process (a class defined inside a function) runs
its clients in process, with a warning — where a model its clients trained earlier in the run
without a disk cache lives in a worker's memory, so the parent trains it again. Worker
processes log no live training curves to the run's trackers (their tracker is a null one).

:func:`open_transport` picks the transport of a run: in process for one worker, the pool
otherwise (``workers``: 0 sizes it to the thread budget, :func:`resolve_workers`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import multiprocessing
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from oneshotfl.devices import deterministic_cudnn
from oneshotfl.plugins import load_plugins
from oneshotfl.protocol.contract import Method, PeerMethod
from oneshotfl.runner.batched import BatchedTransport
from oneshotfl.runner.transport import (
    ClientReply,
    LocalTransport,
    Missing,
    PeerReport,
    Transport,
    attempt,
    receipt_on,
    receive_broadcast,
    update_on,
)
from oneshotfl.training import memo
from oneshotfl.training.progress import NullTracker

if TYPE_CHECKING:
    from oneshotfl.runner.federation import Federation
    from oneshotfl.runner.plan import Schedules

log = logging.getLogger(__name__)

Answer = TypeVar("Answer")
Counted = tuple[Answer | None, Missing, int, int, int]
"""A worker's answer, whoever failed, and the cache hits, misses and disk reads it added."""
_WORKER: dict[str, Any] = {}
"""The worker process's state: its copy of the federation (set by :func:`_start_worker`)."""


def resolve_workers(workers: int, clients: int, client_thread_count: int | None, gpu: bool) -> int:
    """How many worker processes a run uses: ``workers`` when set (at most one per client);
    0 sizes the pool to the thread budget — torch's thread count (``OMP_NUM_THREADS``, else
    the cores) divided by the threads of one client step — on the CPU, and means one process
    on a GPU. On a GPU, ``workers`` > 1 keeps that many clients' updates in flight on it, each
    process launching its own kernels (a small model leaves a GPU waiting on one process's
    launches); their workers come from a forkserver (:func:`start_method`)."""
    if gpu and workers <= 1:
        return 1
    if workers > 0:
        return max(1, min(workers, clients))
    budget = torch.get_num_threads()
    return max(1, min(clients, budget // (client_thread_count or budget)))


def _start_worker(shipped: Federation | bytes, plugins: tuple[str, ...], level: int) -> None:
    """Worker initialiser: log like the parent (through a plain handler of its own: a forked
    copy of the parent's may hold a lock), import the plugins, keep the federation — sent
    pickled to a forkserver's process, so that it is unpickled after the plugins its data or
    models may come from — pin the threads and, on a GPU, choose cuDNN's algorithms as the
    parent did (:func:`~oneshotfl.devices.deterministic_cudnn`: else its clients train with
    other kernels than one process's, ``tests/test_cuda.py``)."""
    fmt = "%(levelname)-8s %(message)s (worker %(process)d)"
    logging.basicConfig(level=level, format=fmt, force=True)
    load_plugins(plugins)  # a forkserver's process has not imported them
    exp = pickle.loads(shipped) if isinstance(shipped, bytes) else shipped
    if exp.device.type == "cuda":
        deterministic_cudnn()
    memo.activate(exp.data.test.x)  # as the parent's run does (training/memo.py)
    if exp.cfg.client_threads is not None:
        torch.set_num_threads(exp.cfg.client_threads)
    _WORKER["exp"] = exp


def _counted(
    step: Callable[[Federation], tuple[Answer | None, Missing]],
) -> tuple[Answer | None, Missing, int, int, int]:
    """Run ``step`` on the worker's federation: its answer, whoever failed, and the cache hits,
    misses and hits read from disk it added (the parent's result counts every party's)."""
    exp: Federation = _WORKER["exp"]
    counts = exp.store.counts
    hits, misses, disk = counts.hits, counts.misses, counts.from_disk
    answer, missing = step(exp)
    return answer, missing, counts.hits - hits, counts.misses - misses, counts.from_disk - disk


def _update(
    method: Method[Any], round_index: int, broadcast: bytes | None, cid: int
) -> tuple[ClientReply | None, Missing, int, int, int]:
    """One client's update in a worker (what :meth:`LocalTransport.upload` does per client)."""

    def step(fed: Federation) -> tuple[ClientReply | None, Missing]:
        received = receive_broadcast(method, broadcast, fed.dims, round_index)
        missing: Missing = {}
        run = functools.partial(update_on, fed, method, cid, round_index, received)
        return attempt(cid, "update", run, missing), missing

    return _counted(step)


def _receive(
    method: PeerMethod[Any],
    receiver: int,
    deliveries: Mapping[int, bytes],
    schedule: tuple[tuple[int, ...], ...],
) -> tuple[PeerReport | None, Missing, int, int, int]:
    """One peer receiver's step in a worker (what :meth:`LocalTransport.relay` does)."""

    def step(fed: Federation) -> tuple[PeerReport | None, Missing]:
        missing: Missing = {}
        run = functools.partial(receipt_on, fed, method, receiver, deliveries, schedule)
        return attempt(receiver, "receipt", run, missing), missing

    return _counted(step)


def accelerator_visible() -> bool:
    """Whether torch sees a GPU (or another accelerator) — or has started CUDA already. On
    such a machine the autograd engine starts one thread per device at the parent's first
    backward pass (even of a CPU model), after which a forked child cannot train."""
    if torch.cuda.is_initialized() or torch.cuda.is_available():
        return True
    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator is not None and accelerator.is_available())


def start_method(threads: int | None) -> str:
    """How the pool starts its workers: ``fork`` only where it is safe — single-threaded
    client steps (a forked child must not use OpenMP threads) on a machine where torch sees no
    accelerator (the autograd engine and CUDA start threads a fork cannot carry) — else the
    ``forkserver`` (``spawn`` where there is none)."""
    methods = multiprocessing.get_all_start_methods()
    if threads == 1 and "fork" in methods and not accelerator_visible():
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _context(threads: int | None) -> multiprocessing.context.BaseContext:
    """The context of :func:`start_method` (a forkserver preloading this module, and so
    torch)."""
    method = start_method(threads)
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([__name__])
    return ctx


@dataclass
class PoolTransport:
    """The in-process transport's steps in ``workers`` processes (see the module docs).

    Attributes:
        federation: the prepared federation (the parent's; each worker gets a copy).
        workers: worker processes (at least 1).
    """

    federation: Federation
    workers: int
    _slots: list[ProcessPoolExecutor] = field(default_factory=list, init=False, repr=False)
    _shipped: Federation | bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"PoolTransport: expected workers >= 1, got {self.workers}")
        exp = dataclasses.replace(self.federation, tracker=NullTracker())
        forked = _context(exp.cfg.client_threads).get_start_method() == "fork"
        # A fork shares the parent's memory as is; a forkserver's worker gets one pickled copy,
        # made once and handed to every worker (and every replacement).
        self._shipped = exp if forked else pickle.dumps(exp)
        self._slots = [self._start() for _ in range(self.workers)]

    def _start(self) -> ProcessPoolExecutor:
        cfg = self.federation.cfg
        level = logging.getLogger().getEffectiveLevel()
        initargs = (self._shipped, tuple(cfg.plugins), level)
        ctx = _context(cfg.client_threads)
        return ProcessPoolExecutor(1, ctx, initializer=_start_worker, initargs=initargs)

    def close(self) -> None:
        """Stop the workers (pending steps are cancelled)."""
        for slot in self._slots:
            slot.shutdown(wait=True, cancel_futures=True)
        self._slots = []

    def _gather(
        self,
        label: str,
        what: str,
        jobs: Mapping[
            int, tuple[Callable[..., tuple[Any, Missing, int, int, int]], tuple[Any, ...]]
        ],
    ) -> tuple[list[Any], Missing]:
        """Submit every client's job (function, arguments) to its worker, then collect the
        answers in client-id order."""
        exp = self.federation
        answers: list[Any] = []
        missing: Missing = {}
        broken: set[ProcessPoolExecutor] = set()
        futures: dict[int, Future[Counted[Any]]] = {}
        sent_to: dict[int, ProcessPoolExecutor] = {}
        for cid, (fn, args) in jobs.items():
            try:
                futures[cid] = self._slot(cid).submit(fn, *args)
            except BrokenProcessPool:  # its worker died since the last step: a new one, once
                self._restart(cid % len(self._slots))
                futures[cid] = self._slot(cid).submit(fn, *args)
            sent_to[cid] = self._slot(cid)
        with exp.tracker.task(label, len(futures)) as advance:
            for cid in sorted(futures):
                try:
                    answer, failed, hits, misses, disk = futures[cid].result()
                except Exception as exc:  # the worker died, or the step could not be sent
                    if isinstance(exc, BrokenProcessPool):
                        broken.add(sent_to[cid])
                    log.warning("client %d: its worker failed in its %s", cid, what, exc_info=True)
                    missing[f"client {cid}"] = (
                        f"failed in its {what}: worker process: {type(exc).__name__}: {exc}"
                    )
                    advance(1)
                    continue
                exp.store.counts.hits += hits
                exp.store.counts.misses += misses
                exp.store.counts.from_disk += disk
                missing.update(failed)
                if answer is not None:
                    answers.append(answer)
                advance(1)
        for slot, executor in enumerate(self._slots):  # a dead worker is replaced now, once
            if executor in broken:
                self._restart(slot)
        return answers, missing

    def _restart(self, slot: int) -> None:
        self._slots[slot].shutdown(wait=False, cancel_futures=True)
        self._slots[slot] = self._start()

    def _in_process(self, method: Method[Any]) -> LocalTransport | None:
        """The in-process transport when ``method`` cannot be sent to a worker process."""
        try:
            pickle.dumps(method)
        except Exception as exc:
            log.warning(
                "%s cannot be sent to worker processes (%s): its clients run in process",
                method.name,
                exc,
            )
            return LocalTransport(self.federation)
        return None

    def _slot(self, cid: int) -> ProcessPoolExecutor:
        return self._slots[cid % len(self._slots)]

    def upload(
        self, key: str, method: Method[Any], round_index: int, broadcast: bytes | None
    ) -> tuple[Iterable[ClientReply], Missing]:
        exp = self.federation
        # a bad broadcast fails here, as in process
        receive_broadcast(method, broadcast, exp.dims, round_index)
        local = self._in_process(method)
        if local is not None:
            return local.upload(key, method, round_index, broadcast)
        jobs = {
            shard.client_id: (_update, (method, round_index, broadcast, shard.client_id))
            for shard in exp.data.clients
        }
        return self._gather(f"{key}: clients ({self.workers} workers)", "update", jobs)

    def relay(
        self,
        key: str,
        method: PeerMethod[Any],
        routes: Mapping[int, Mapping[int, bytes]],
        schedules: Schedules,
    ) -> tuple[list[PeerReport], Missing]:
        local = self._in_process(method)
        if local is not None:
            return local.relay(key, method, routes, schedules)
        jobs = {r: (_receive, (method, r, dict(routes[r]), tuple(schedules[r]))) for r in routes}
        return self._gather(f"{key}: receivers ({self.workers} workers)", "receipt", jobs)


@contextlib.contextmanager
def open_transport(exp: Federation) -> Iterator[tuple[Transport, int]]:
    """The transport of a local run and its number of workers: in process for one worker,
    else a :class:`PoolTransport` (closed when the run ends)."""
    cfg = exp.cfg
    workers = resolve_workers(
        cfg.workers, len(exp.data.clients), cfg.client_threads, exp.device.type == "cuda"
    )
    if cfg.client_batch > 1:  # clients handled together, in this process
        yield BatchedTransport(exp), 1
        return
    if workers == 1:
        yield LocalTransport(exp), 1
        return
    log.info("client steps in %d worker processes", workers)
    pool = PoolTransport(exp, workers)
    try:
        yield pool, workers
    finally:
        pool.close()


__all__ = ["PoolTransport", "open_transport", "resolve_workers", "start_method"]
