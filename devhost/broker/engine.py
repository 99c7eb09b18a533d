"""Queue state: what is available, scheduled, locked or dead-lettered, and the counters.

Everything here is in memory and indexed so that a delivery, a settlement or a timer step costs
O(log n): available messages sit in a per-entity heap of sequence numbers, scheduled messages and
lock expiries in global heaps, and stale heap entries are skipped when popped rather than
searched for when they go stale. The engine knows nothing about AMQP links; the server asks it
for the next message of an entity and reports what the client did with it.

All public methods take ``lock`` because the control API and ``Broker.stats()`` read from other
threads than the reactor's.
"""

from __future__ import annotations

import heapq
import threading
import uuid
from collections.abc import Callable, Iterable

from . import codec
from .addresses import dead_letter_entity
from .dedupe import DuplicateDetector
from .faults import FaultConfig, FaultInjector
from .model import Entity, Entry, Limits, QueueStats, Settlement, State, wall_ms
from .store import Store, StoredMessage

MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
TTL_EXPIRED_REASON = "TTLExpiredException"
DEAD_LETTER_REASON = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION = "DeadLetterErrorDescription"


class Engine:
    def __init__(
        self,
        queues: Iterable[str],
        store: Store,
        limits: Limits,
        faults: FaultConfig | None = None,
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        self.lock = threading.RLock()
        self.limits = limits
        self._store = store
        self._clock = clock
        self._faults = FaultInjector(faults)
        self.queue_names: dict[str, str] = {}
        self._entities: dict[str, Entity] = {}
        self._dedupe: dict[str, DuplicateDetector] = {}
        self._last_seq: dict[str, int] = {}
        self._locks: dict[uuid.UUID, tuple[Entity, Entry]] = {}
        self._lock_heap: list[tuple[int, uuid.UUID]] = []
        self._due: list[tuple[int, int, str]] = []
        self._woken: set[str] = set()
        for queue in queues:
            self._declare(queue)

    # -- setup -----------------------------------------------------------------------------

    def _declare(self, queue: str) -> None:
        if queue.lower() in self.queue_names:
            return
        self.queue_names[queue.lower()] = queue
        stats = QueueStats()
        self._entities[queue] = Entity(queue, queue, False, stats)
        dlq = dead_letter_entity(queue)
        self._entities[dlq] = Entity(dlq, queue, True, QueueStats())
        self._dedupe[queue] = DuplicateDetector(self.limits.dedupe_window_ms)
        self._last_seq[queue] = 0

    def restore(self) -> int:
        """Load what the store kept; returns the number of messages restored."""
        with self.lock:
            now = self._clock()
            snapshot = self._store.load(now)
            for queue, seq in snapshot.last_sequence.items():
                if queue in self._last_seq:
                    self._last_seq[queue] = max(self._last_seq[queue], seq)
            restored = 0
            for row in snapshot.messages:
                if row.queue not in self._last_seq:
                    continue  # a queue this broker no longer declares
                parsed = codec.parse_message(row.payload)
                entity = self._entities[
                    dead_letter_entity(row.queue) if row.dead_letter else row.queue
                ]
                entry = Entry(
                    seq=row.seq,
                    header=parsed.header,
                    annotations=parsed.annotations,
                    bare=parsed.bare,
                    message_id=row.message_id,
                    enqueued_ms=row.enqueued_ms,
                    visible_ms=row.visible_ms,
                    delivery_count=row.delivery_count,
                    expires_ms=None if parsed.ttl_ms is None else row.enqueued_ms + parsed.ttl_ms,
                    stored=row.payload,
                )
                entity.entries[row.seq] = entry
                self._make_available(entity, entry, now)
                self._last_seq[row.queue] = max(self._last_seq[row.queue], row.seq)
                restored += 1
            for queue, message_id, expires in sorted(snapshot.message_ids, key=lambda r: r[2]):
                if queue in self._dedupe:
                    self._dedupe[queue].restore(message_id, expires)
            return restored

    # -- lookups ---------------------------------------------------------------------------

    def pop_woken(self) -> set[str]:
        """Entities that got available messages since the last call, for the server to dispatch."""
        with self.lock:
            woken, self._woken = self._woken, set()
            return woken

    # -- faults and stats ------------------------------------------------------------------

    @property
    def faults(self) -> FaultConfig:
        with self.lock:
            return self._faults.config

    def set_faults(self, config: FaultConfig) -> None:
        with self.lock:
            self._faults.configure(config)

    def stats(self) -> dict[str, dict[str, int]]:
        with self.lock:
            out: dict[str, dict[str, int]] = {}
            for queue in self.queue_names.values():
                main = self._entities[queue]
                dlq = self._entities[dead_letter_entity(queue)]
                s = main.stats
                out[queue] = {
                    "active": main.n_ready,
                    "scheduled": main.n_scheduled,
                    "locked": main.n_locked,
                    "deadLettered": len(dlq.entries),
                    "sent": s.sent,
                    "delivered": s.delivered,
                    "completed": s.completed,
                    "abandoned": s.abandoned,
                    "duplicatesSuppressed": s.duplicates_suppressed,
                    "dropped": s.dropped,
                    "duplicated": s.duplicated,
                    "delayed": s.delayed,
                }
            return out

    # -- incoming --------------------------------------------------------------------------

    def accept_send(self, queue: str, payload: bytes) -> None:
        """Enqueue a sent message (or every message of a batch envelope).

        Raises ``codec.CodecError`` before changing anything if any message is malformed.
        """
        parsed = codec.parse_sent(payload)
        with self.lock:
            now = self._clock()
            for message in parsed:
                self._ingest(queue, message, now)

    def _ingest(self, queue: str, message: codec.ParsedMessage, now: int) -> None:
        stats = self._entities[queue].stats
        stats.sent += 1
        if message.message_id is not None:
            detector = self._dedupe[queue]
            if detector.seen(message.message_id, now):
                stats.duplicates_suppressed += 1
                return
            expires = detector.record(message.message_id, now)
            self._store.remember_id(queue, message.message_id, expires)
        decision = self._faults.decide(queue)
        if decision.drop:
            stats.dropped += 1
            return
        visible = message.scheduled_ms or 0
        if decision.delay_ms:
            stats.delayed += 1
            visible = max(visible, now + decision.delay_ms)
        self._enqueue(queue, message, now, visible)
        if decision.duplicate:
            stats.duplicated += 1
            self._enqueue(queue, message, now, visible)

    def schedule(self, queue: str, payloads: list[bytes]) -> list[int]:
        """Enqueue messages sent through ``schedule-message``; their annotation sets the time."""
        parsed = [codec.parse_message(raw) for raw in payloads]
        with self.lock:
            now = self._clock()
            seqs = []
            for message in parsed:
                self._entities[queue].stats.sent += 1
                seqs.append(self._enqueue(queue, message, now, message.scheduled_ms or 0))
            return seqs

    def cancel_scheduled(self, queue: str, seqs: Iterable[int]) -> None:
        with self.lock:
            entity = self._entities[queue]
            for seq in seqs:
                entry = entity.entries.get(seq)
                if entry is not None and entry.state is State.SCHEDULED:
                    del entity.entries[seq]
                    entity.n_scheduled -= 1
                    self._store.delete(queue, seq)

    def _enqueue(self, queue: str, message: codec.ParsedMessage, now: int, visible: int) -> int:
        seq = self._last_seq[queue] + 1
        self._last_seq[queue] = seq
        self._store.set_last_sequence(queue, seq)
        entry = Entry(
            seq=seq,
            header=message.header,
            annotations=message.annotations,
            bare=message.bare,
            message_id=message.message_id,
            enqueued_ms=now,
            visible_ms=visible if visible > now else 0,
            delivery_count=0,
            expires_ms=None if message.ttl_ms is None else now + message.ttl_ms,
            stored=message.raw,
        )
        entity = self._entities[queue]
        entity.entries[seq] = entry
        self._make_available(entity, entry, now)
        self._persist(entity, entry)
        return seq

    # -- outgoing --------------------------------------------------------------------------

    def take(self, name: str, lock_token: uuid.UUID | None) -> bytes | None:
        """Next available message of ``name``, encoded for delivery, or None.

        With a lock token the message is locked (peek-lock); without one it is removed
        (receive-and-delete).
        """
        with self.lock:
            entity = self._entities[name]
            now = self._clock()
            while entity.ready:
                seq = heapq.heappop(entity.ready)
                entry = entity.entries.get(seq)
                if entry is None or entry.state is not State.READY:
                    continue
                entity.n_ready -= 1
                if (
                    entry.expires_ms is not None
                    and entry.expires_ms <= now
                    and not entity.dead_letter
                ):
                    self._dead_letter(
                        entity, entry, TTL_EXPIRED_REASON, "The message expired.", now
                    )
                    continue
                entity.stats.delivered += 1
                if lock_token is None:
                    del entity.entries[seq]
                    entity.stats.completed += 1
                    self._store.delete(entity.queue, seq)
                    return entry.encode()
                entry.state = State.LOCKED
                entry.lock_token = lock_token
                entry.locked_until_ms = now + self.limits.lock_ms
                entity.n_locked += 1
                self._locks[lock_token] = (entity, entry)
                heapq.heappush(self._lock_heap, (entry.locked_until_ms, lock_token))
                return entry.encode(entry.locked_until_ms)
            return None

    def settle(
        self,
        lock_token: uuid.UUID,
        settlement: Settlement,
        reason: str | None = None,
        description: str | None = None,
    ) -> bool:
        """Apply the client's outcome; False when the lock is lost (expired or unknown)."""
        with self.lock:
            found = self._locks.pop(lock_token, None)
            if found is None:
                return False
            entity, entry = found
            entity.n_locked -= 1
            entry.lock_token = None
            now = self._clock()
            if settlement is Settlement.COMPLETE:
                del entity.entries[entry.seq]
                entity.stats.completed += 1
                self._store.delete(entity.queue, entry.seq)
            elif settlement is Settlement.ABANDON:
                entity.stats.abandoned += 1
                self._redeliver(entity, entry, now)
            elif settlement is Settlement.RELEASE:
                entry.state = State.READY
                self._make_available(entity, entry, now)
            else:
                self._dead_letter(entity, entry, reason, description, now)
            return True

    def renew(self, lock_tokens: Iterable[uuid.UUID]) -> list[int] | None:
        """New lock expirations (ms), or None if any lock is lost (then nothing is renewed)."""
        with self.lock:
            tokens = list(lock_tokens)
            if any(token not in self._locks for token in tokens):
                return None
            until = self._clock() + self.limits.lock_ms
            for token in tokens:
                self._locks[token][1].locked_until_ms = until
                heapq.heappush(self._lock_heap, (until, token))
            return [until] * len(tokens)

    def peek(self, name: str, from_seq: int, count: int) -> list[bytes]:
        with self.lock:
            entity = self._entities[name]
            seqs = heapq.nsmallest(count, (s for s in entity.entries if s >= from_seq))
            return [entity.entries[s].encode(peeked=True) for s in seqs]

    # -- time ------------------------------------------------------------------------------

    def seconds_to_deadline(self) -> float | None:
        """Until the earliest scheduled message or lock expiry, None when there is neither.
        A head may be stale (a renewed lock, a cancelled schedule): waking early is harmless."""
        with self.lock:
            heads = [heap[0][0] for heap in (self._due, self._lock_heap) if heap]
            if not heads:
                return None
            return max(0.0, (min(heads) - self._clock()) / 1000)

    def tick(self) -> None:
        """Activate due scheduled messages and expire locks."""
        with self.lock:
            now = self._clock()
            due = self._due
            while due and due[0][0] <= now:
                visible, seq, name = heapq.heappop(due)
                entity = self._entities[name]
                entry = entity.entries.get(seq)
                if (
                    entry is None
                    or entry.state is not State.SCHEDULED
                    or entry.visible_ms != visible
                ):
                    continue
                entity.n_scheduled -= 1
                entry.visible_ms = 0
                entry.enqueued_ms = visible
                self._make_available(entity, entry, now)
                self._persist(entity, entry)
            heap = self._lock_heap
            while heap and heap[0][0] <= now:
                until, token = heapq.heappop(heap)
                found = self._locks.get(token)
                if found is None or found[1].locked_until_ms != until:
                    continue
                del self._locks[token]
                entity, entry = found
                entity.n_locked -= 1
                entry.lock_token = None
                self._redeliver(entity, entry, now)
            for detector in self._dedupe.values():
                detector.prune(now)

    # -- transitions -----------------------------------------------------------------------

    def _make_available(self, entity: Entity, entry: Entry, now: int) -> None:
        if entry.visible_ms > now:
            entry.state = State.SCHEDULED
            entity.n_scheduled += 1
            heapq.heappush(self._due, (entry.visible_ms, entry.seq, entity.name))
        else:
            entry.state = State.READY
            entity.n_ready += 1
            heapq.heappush(entity.ready, entry.seq)
            self._woken.add(entity.name)

    def _redeliver(self, entity: Entity, entry: Entry, now: int) -> None:
        """After an abandon or an expired lock: count the attempt, dead-letter past the limit."""
        entry.delivery_count += 1
        if not entity.dead_letter and entry.delivery_count >= self.limits.max_delivery_count:
            description = (
                f"Message could not be consumed after {self.limits.max_delivery_count}"
                " delivery attempts."
            )
            self._dead_letter(entity, entry, MAX_DELIVERY_REASON, description, now)
            return
        self._make_available(entity, entry, now)
        self._persist(entity, entry)

    def _dead_letter(
        self, entity: Entity, entry: Entry, reason: str | None, description: str | None, now: int
    ) -> None:
        props = {
            key: value
            for key, value in ((DEAD_LETTER_REASON, reason), (DEAD_LETTER_DESCRIPTION, description))
            if value is not None
        }
        if props:
            entry.bare = codec.with_application_properties(entry.bare, props)
            entry.stored = b""
        del entity.entries[entry.seq]
        target = self._entities[dead_letter_entity(entity.queue)]
        entry.visible_ms = 0
        target.entries[entry.seq] = entry
        self._make_available(target, entry, now)
        self._persist(target, entry)

    def _persist(self, entity: Entity, entry: Entry) -> None:
        if not self._store.durable:
            return
        self._store.save(
            StoredMessage(
                queue=entity.queue,
                seq=entry.seq,
                dead_letter=entity.dead_letter,
                payload=entry.stored
                or codec.encode_message(
                    entry.header, entry.delivery_count, entry.annotations, entry.bare
                ),
                message_id=entry.message_id,
                enqueued_ms=entry.enqueued_ms,
                visible_ms=entry.visible_ms,
                delivery_count=entry.delivery_count,
            )
        )

    # -- persistence -----------------------------------------------------------------------

    @property
    def store_pending(self) -> bool:
        with self.lock:
            return self._store.pending

    def flush(self) -> None:
        """Write batched changes; raises the store's error so the caller can fail the sends."""
        with self.lock:
            self._store.flush(self._clock())

    def close(self) -> None:
        with self.lock:
            self._store.close()
