"""Worker threads that own a SQL store's connections.

Each of ``count`` daemon threads owns one :class:`Driver` (one connection)
and takes calls from one queue, in submission order.  A call's caller waits
on Trio: cancelled while its call is still queued, it withdraws the call;
once the call has started, it waits it out (the outcome is never lost), and
a call with a cut time is interrupted through its driver when that time
passes.  Threads hold no reference to the store between calls: a store
dropped without ``aclose`` stops them from a ``weakref.finalize``.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final, TypeVar, final

import outcome
import trio

from ...errors import Error, ErrorClass
from ._driver import Driver

__all__ = ["Workers", "current_cut"]

T = TypeVar("T")

#: A call's states, in the order it goes through them.
_QUEUED: Final = 0
_RUNNING: Final = 1
_FINISHED: Final = 2
_WITHDRAWN: Final = 3
#: The queue item that stops one thread.
_STOP: Final = None
#: A waiter wakes through a pipe Trio watches when it asks to and the
#: platform has one (one wake-up of Trio's I/O loop, cheaper than
#: ``run_sync_soon``); else through the Trio token.
_PIPES: Final = os.name == "posix"


class _Call:
    __slots__ = ("cut", "cut_at", "driver", "error", "event", "fn", "state", "token", "value")

    def __init__(
        self,
        fn: Callable[[Driver], Any],
        token: trio.lowlevel.TrioToken | None,
        cut_at: float = math.inf,
    ) -> None:
        self.fn: Callable[[Driver], Any] | None = fn
        #: when the call is cut, as ``time.monotonic`` (what the thread reads)
        self.cut_at = cut_at
        self.token = token
        self.event: trio.Event | None = None if token is None else trio.Event()
        self.state = _QUEUED
        #: what ``fn`` returned, or raised (set before the call finishes)
        self.value: Any = None
        self.error: BaseException | None = None
        self.driver: Driver | None = None
        #: whether the call was interrupted at its cut time
        self.cut = False


class _Shared:
    """What the threads share with the store (never the store itself)."""

    __slots__ = ("alive", "lock", "requests", "wake", "writer")

    def __init__(self, wake: tuple[int, int] | None, count: int) -> None:
        self.requests: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        #: the group commit's own queue, served by thread 0 alone when there
        #: are several threads: every batch on one connection, as a plain
        #: loop would write them (thread 0 then serves nothing else)
        self.writer = self.requests if count == 1 else queue.SimpleQueue()
        self.lock = threading.Lock()
        self.wake = wake
        self.alive = 0


#: The call the current worker thread is making.
_CURRENT = threading.local()


def current_cut() -> tuple[float, bool]:
    """In a worker: when the call it makes is cut (``time.monotonic``), and
    whether it has been."""
    call: _Call | None = getattr(_CURRENT, "call", None)
    return (math.inf, False) if call is None else (call.cut_at, call.cut)


def _queues(shared: _Shared, count: int) -> list[queue.SimpleQueue[_Call | None]]:
    """The queue each of ``count`` threads serves."""
    return [shared.writer, *[shared.requests] * (count - 1)]


def _serve(
    shared: _Shared,
    requests: queue.SimpleQueue[_Call | None],
    make_driver: Callable[[], Driver],
    abandoned: list[bool],
) -> None:
    driver = make_driver()
    lock = shared.lock
    try:
        while True:
            call = requests.get()
            if call is None:
                return
            with lock:
                if call.state == _WITHDRAWN:
                    continue
                call.state = _RUNNING
                call.driver = driver
            fn, call.fn = call.fn, None
            assert fn is not None
            _CURRENT.call = call
            try:
                call.value = fn(driver)
            except BaseException as exc:  # the caller's to raise
                call.error = exc
            _CURRENT.call = None
            del fn
            with lock:
                call.state = _FINISHED
                call.driver = None
            _deliver(call, shared.wake)
            del call
    finally:
        driver.close()
        with lock:
            shared.alive -= 1
            last = shared.alive == 0
        if last and abandoned[0] and shared.wake is not None:
            for fd in shared.wake:  # nobody else writes to it any more
                os.close(fd)


def _deliver(call: _Call, wake: tuple[int, int] | None) -> None:
    try:
        if call.token is None:
            assert wake is not None
            os.write(wake[1], b"\0")
        else:
            assert call.event is not None
            call.token.run_sync_soon(call.event.set)
    except OSError:  # the pipe is full: a wake-up is pending anyway
        pass
    except trio.RunFinishedError:  # the Trio run is over: nobody waits
        pass


def _raise(call: _Call) -> None:
    """Raise what ``call`` raised, its reference dropped (no cycle through
    the traceback)."""
    error, call.error = call.error, None
    assert error is not None
    try:
        raise error
    finally:
        del error


def _drain(fd: int) -> None:
    """Read the wake-up pipe empty enough (one more wake-up, at worst)."""
    try:
        os.read(fd, 512)
    except BlockingIOError:  # another waiter read it
        return


def _stop_all(shared: _Shared, count: int, abandoned: list[bool]) -> None:
    abandoned[0] = True
    for requests in _queues(shared, count):
        requests.put(_STOP)


@final
class _Slot:
    """One slot of a ``CapacityLimiter``, taken without a scheduling round
    when one is free (``acquire`` always yields, a commit's worth of work)."""

    __slots__ = ("_limiter",)

    def __init__(self, limiter: trio.CapacityLimiter) -> None:
        self._limiter = limiter

    async def __aenter__(self) -> None:
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            await self._limiter.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self._limiter.release()


@final
class Workers:
    """``count`` threads, each owning a driver from ``make_driver``."""

    def __init__(
        self, make_driver: Callable[[], Driver], count: int, name: str, *, limited: bool = False
    ) -> None:
        self._make_driver = make_driver
        self._count = count
        #: ``limited``: a call first takes one of ``count`` slots (cancellable
        #: while it waits), so a call submitted always finds a free thread
        self.limiter: trio.CapacityLimiter | None = trio.CapacityLimiter(count) if limited else None
        #: a slot of :attr:`limiter`, as an async context manager
        self.slot: _Slot | None = None if self.limiter is None else _Slot(self.limiter)
        self._name = name
        self._shared: _Shared | None = None
        self._threads: list[threading.Thread] = []
        self._pid = os.getpid()
        self._closed = False
        self._abandoned = [False]
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def threads(self) -> list[threading.Thread]:
        return list(self._threads)

    def _closed_error(self) -> Error:
        return Error(ErrorClass.STORAGE_FAILED, "store is closed", {"store": self._name})

    def _submit(self, call: _Call, writer: bool) -> None:
        if self._closed:
            raise self._closed_error()
        if self._threads and os.getpid() != self._pid:
            # A fork copied the store, not its threads: the call would wait
            # for ever, and the connections are not the child's to use.
            raise Error(
                ErrorClass.STORAGE_FAILED,
                "store used in a forked process: open a new one there",
                {"store": self._name},
            )
        if self._shared is None:
            try:
                self._start()
            except (OSError, RuntimeError) as exc:  # no pipe, no thread: a full process
                raise Error(
                    ErrorClass.STORAGE_FAILED,
                    "cannot start the store's worker threads",
                    {"store": self._name, "cause": f"{type(exc).__name__}: {exc}"[:300]},
                ) from exc
        assert self._shared is not None
        (self._shared.writer if writer else self._shared.requests).put(call)

    def _start(self) -> None:
        wake: tuple[int, int] | None = None
        if _PIPES:
            wake = os.pipe()
            for fd in wake:
                os.set_blocking(fd, False)
        shared = _Shared(wake, self._count)
        self._pid = os.getpid()
        try:
            for n, requests in enumerate(_queues(shared, self._count)):
                thread = threading.Thread(
                    target=_serve,
                    args=(shared, requests, self._make_driver, self._abandoned),
                    name=f"trio_backplane {self._name} worker {n}",
                    daemon=True,
                )
                with shared.lock:
                    shared.alive += 1
                thread.start()
                self._threads.append(thread)
        except BaseException:
            _stop_all(shared, len(self._threads), [False])
            for thread in self._threads:
                thread.join()
            if wake is not None:
                for fd in wake:
                    os.close(fd)
            self._threads = []
            raise
        self._shared = shared
        self._finalizer = weakref.finalize(self, _stop_all, shared, self._count, self._abandoned)

    async def run(
        self,
        fn: Callable[[Driver], T],
        *,
        cut_at: float = math.inf,
        withdrawable: bool = True,
        wake: bool = False,
        slot_held: bool = False,
        writer: bool = False,
    ) -> tuple[outcome.Outcome[T], bool]:
        """The outcome of ``fn(driver)`` in a worker thread, and whether the
        call was cut.

        ``cut_at`` (Trio time): past it, the driver is interrupted.
        ``withdrawable``: a cancelled caller withdraws the call while it is
        queued (``Cancelled`` raised); otherwise, and once it started, the
        call is waited out and the cancellation strikes at the caller's
        next checkpoint.  ``wake``: through the wake-up pipe (one such
        waiter at a time).  ``slot_held``: the caller holds a slot of
        :attr:`limiter` already.  ``writer``: the group commit's batch, run
        by thread 0 (which runs nothing else when there are several)."""
        if withdrawable:
            await trio.lowlevel.checkpoint_if_cancelled()
        if self.slot is None or slot_held:
            return await self._run(fn, cut_at, withdrawable, wake, writer)
        async with self.slot:
            return await self._run(fn, cut_at, withdrawable, wake, writer)

    async def write(self, fn: Callable[[Driver], None], cut_at: float) -> None:
        """``fn(driver)`` in the writer thread (the group commit's batch; its
        caller holds a slot of :attr:`limiter` when there is one), waited out
        whatever happens: a cancellation strikes at the caller's next
        checkpoint.  Raises what ``fn`` raised; cut at ``cut_at`` (Trio time)."""
        if cut_at != math.inf or not _PIPES:
            result, _ = await self._run(fn, cut_at, False, True, True)
            result.unwrap()
            return
        # The common case, a call never cut, waited for without the general
        # path's layers (a commit's worth of work on a small one).
        call = _Call(fn, None)
        self._submit(call, True)
        try:
            await self._done(call)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await self._done(call)
        if call.error is not None:
            _raise(call)

    async def _run(
        self, fn: Callable[[Driver], T], cut_at: float, withdrawable: bool, wake: bool, writer: bool
    ) -> tuple[outcome.Outcome[T], bool]:
        token = None if wake and _PIPES else trio.lowlevel.current_trio_token()
        cut_mono = cut_at
        if cut_at != math.inf:
            cut_mono = time.monotonic() + (cut_at - trio.current_time())
        call = _Call(fn, token, cut_mono)
        self._submit(call, writer)
        await self._wait(call, cut_at, withdrawable)
        if call.error is None:
            return outcome.Value(call.value), call.cut
        return outcome.Error(call.error), call.cut

    async def _wait(self, call: _Call, cut_at: float, withdrawable: bool) -> None:
        if cut_at == math.inf:
            # Never cut: no scope to enter (a batch's every commit pays for
            # one); shielded only once a cancellation arrives.
            try:
                await self._done(call)
            except trio.Cancelled:
                if withdrawable and self._withdraw(call):
                    raise
                with trio.CancelScope(shield=True):
                    await self._done(call)
            return
        if withdrawable:
            with trio.CancelScope(deadline=cut_at):
                try:
                    await self._done(call)
                    return
                except trio.Cancelled:
                    if self._withdraw(call):
                        raise
            if call.state == _WITHDRAWN:  # its cut time came before a thread did
                self._not_started(call)
                return
        with trio.CancelScope(shield=True, deadline=cut_at):
            await self._done(call)
        if call.state != _FINISHED:
            self._cut(call)
            if call.state == _WITHDRAWN:  # no thread took it: nothing to wait for
                return
            with trio.CancelScope(shield=True):
                await self._done(call)

    def _not_started(self, call: _Call) -> None:
        """``call``, withdrawn at its cut time: cut, and failed."""
        call.cut = True
        call.error = Error(
            ErrorClass.STORAGE_FAILED,
            f"{self._name} call cut at its deadline: no worker took it in time",
            {"store": self._name},
        )

    def _withdraw(self, call: _Call) -> bool:
        assert self._shared is not None
        with self._shared.lock:
            if call.state == _QUEUED:
                call.state = _WITHDRAWN
                return True
            return False

    def _cut(self, call: _Call) -> None:
        assert self._shared is not None
        with self._shared.lock:
            if call.state == _QUEUED:
                call.state = _WITHDRAWN
                self._not_started(call)
                return
            call.cut = True
            if call.driver is not None:  # under the lock: never a finished call's
                call.driver.interrupt()

    async def _done(self, call: _Call) -> None:
        if call.event is not None:
            await call.event.wait()
            return
        assert self._shared is not None
        assert self._shared.wake is not None
        fd = self._shared.wake[0]
        while call.state < _FINISHED:  # finished or withdrawn
            await trio.lowlevel.wait_readable(fd)
            _drain(fd)

    async def aclose(self) -> None:
        """Let the calls submitted finish, then stop and join the threads
        (each closes its driver)."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        shared = self._shared
        if shared is None or os.getpid() != self._pid:
            await trio.lowlevel.checkpoint()
            return
        for requests in _queues(shared, len(self._threads)):
            requests.put(_STOP)
        await trio.to_thread.run_sync(self._join)
        if self._finalizer is not None:
            self._finalizer.detach()
        if shared.wake is not None:
            trio.lowlevel.notify_closing(shared.wake[0])
            for fd in shared.wake:
                os.close(fd)

    def _join(self) -> None:
        for thread in self._threads:
            thread.join()
