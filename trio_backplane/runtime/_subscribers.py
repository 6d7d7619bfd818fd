"""Subscriber fan-out: a slow subscriber never delays the run.

Each subscriber gets its own memory channel.  Publishing never waits: a
transient event that finds ``buffer`` events already waiting for that
subscriber is dropped and counted, and the next event the subscriber does
get is preceded by ``events_dropped`` with the count.  Every other event is
always delivered (it may wait beyond ``buffer``).  The run's last word (its
terminal event, or ``storage_failed``) is the last event published: a worker
that ignored its cancellation publishes nothing after it.  When the
conversation closes, the channels close after what they hold: a subscriber
can still drain them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from ._types import TRANSIENT_EVENTS, Event

__all__ = ["Hub"]


class _Subscriber:
    __slots__ = ("buffer", "dropped", "send")

    def __init__(self, buffer: int, send: trio.MemorySendChannel[Event]) -> None:
        self.buffer = buffer
        self.send = send
        self.dropped = 0


class Hub:
    """Publishes events to every subscriber, without ever blocking."""

    def __init__(self, dropped: Callable[[int], Event]) -> None:
        self._subscribers: list[_Subscriber] = []
        self._dropped = dropped
        self._closed = False
        self._finished = False

    @property
    def active(self) -> bool:
        """Whether an event published now reaches anyone (publishing costs
        nothing else): a subscriber is attached and the run's last word has
        not been said."""
        return bool(self._subscribers) and not self._finished

    def finish(self) -> None:
        """The run's last word was said: publish nothing more, and end every
        subscription (each drains what its channel holds, then ends; one
        made from now on is ended at once), so a subscriber looping over its
        channel never waits for an event that cannot come."""
        self._finished = True
        self.close()

    def subscribe(self, buffer: int) -> trio.MemoryReceiveChannel[Event]:
        send, receive = trio.open_memory_channel[Event](math.inf)
        if self._closed:
            send.close()
        else:
            self._subscribers.append(_Subscriber(buffer, send))
        return receive

    def publish(self, event: Event) -> None:
        if self._finished:
            return
        transient = event.type in TRANSIENT_EVENTS
        for subscriber in list(self._subscribers):
            try:
                if (
                    transient
                    and subscriber.send.statistics().current_buffer_used >= subscriber.buffer
                ):
                    subscriber.dropped += 1
                    continue
                if subscriber.dropped:
                    subscriber.send.send_nowait(self._dropped(subscriber.dropped))
                    subscriber.dropped = 0
                subscriber.send.send_nowait(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.remove(subscriber)

    def close(self) -> None:
        """No more events; subscribers drain what their channels hold."""
        self._closed = True
        for subscriber in self._subscribers:
            subscriber.send.close()
        self._subscribers.clear()
