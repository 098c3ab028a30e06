"""The ``collective`` transport: learner rank 0 serves each version over a torch process group.

Rank 0 keeps the newest version as one flat CPU buffer, filled bucket by bucket as the learner
gathers it (``WeightServer.offer``; the version before last's buffer, when no transfer still
sends it), and runs a small server thread around a ``TCPStore`` on its
node. A replica that finds a newer version on the board asks
that server for it (``request``): it takes a ticket (a counter in the store) and says how many
engine workers it has. The server reads tickets in order and sends up to ``concurrency`` at once,
each on a thread of its own: it files the version and the tensor layout under the ticket, forms a
process group of itself (rank 0) and the replica's workers (ranks 1..w), and broadcasts the buffer
bucket by bucket (``bucket_bytes``). Each worker loads a bucket's tensors as it arrives
(``receive``). No file is written on either side. A replica whose workers stall holds one sending
thread until ``timeout_s``; the others go on.

A group lives for one transfer, so a replica that starts late, restarts or dies does not touch the
others: a receiver that dies fails its own transfer (the server logs it and serves the next
ticket), and its replacement asks again for the newest version. The price is one group set-up
per transfer: about a millisecond with gloo. gloo carries CPU buffers; with ``backend="nccl"``
each bucket is copied to the learner's GPU as it is sent, the receivers' buckets live on their GPUs,
and NCCL carries them (not yet run on a GPU).

Only JSON and raw tensor bytes cross the wire: nothing is unpickled. The store has no auth of its
own, so each server makes a token and files it with its address on the board (inside Ray, behind
Ray's own auth). A request must carry ``proof(token, ticket)`` or it is refused, and a ticket's
header and group keys sit under a prefix derived from the token: a client of the port without the
token can neither ask for weights nor find a transfer to join. Keep the port inside the cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from raypost.weights.channel import WeightChannel, register
from raypost.weights.specs import Spec, in_order, nbytes

log = logging.getLogger("raypost")

STOP = "stop"


def buckets_of(meta: list[tuple[str, str, list[int], int, int]], bucket_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges [lo, hi) of the flat buffer that hold whole tensors, each at most ``bucket_bytes``
    (a larger tensor is a bucket of its own). ``meta`` is ``memfd.layout``'s, in buffer order."""
    out: list[tuple[int, int]] = []
    lo = hi = 0
    for *_, offset, size in meta:
        if hi > lo and offset + size - lo > bucket_bytes:
            out.append((lo, hi))
            lo = offset
        hi = offset + size
    if hi > lo:
        out.append((lo, hi))
    return out


def proof(token: str, what: str) -> str:
    """What only a holder of the server's token can write for ``what`` (a ticket's request or scope)."""
    return hmac.new(token.encode(), what.encode(), hashlib.sha256).hexdigest()


def scope(token: str, ticket: int) -> str:
    """The store prefix of a ticket's header and group: unguessable without the token."""
    return "g" + proof(token, f"scope/{ticket}")[:32]


def _group(store: Any, prefix: str, rank: int, size: int, backend: str, timeout_s: float) -> Any:
    """A process group of ``size`` ranks for one transfer, met through ``store`` under ``prefix``."""
    prefix = dist.PrefixStore(f"{prefix}/pg/", store)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(prefix, rank, size)
    return dist.ProcessGroupGloo(prefix, rank, size, timedelta(seconds=timeout_s))


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


class WeightServer:
    """Learner rank 0's side: the newest version, sent to each replica that asks for it."""

    def __init__(
        self,
        host: str,
        backend: str = "gloo",
        bucket_bytes: int = 64 << 20,
        timeout_s: float = 60.0,
        ticket_wait_s: float = 30.0,
        concurrency: int = 4,
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.backend, self.bucket_bytes, self.timeout_s = backend, bucket_bytes, timeout_s
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.ticket_wait_s = ticket_wait_s  # a ticket taken but never filed (its replica died) is skipped
        self.store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(days=30))
        self.token = secrets.token_hex(16)
        self.address = {"host": host, "port": self.store.port, "backend": backend, "token": self.token}
        self._offer: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._sending: dict[int, int] = {}  # id of a buffer: transfers of it in flight
        self._spare: torch.Tensor | None = None  # an older version's buffer that nothing sends: refilled next
        self.sent: list[dict[str, Any]] = []  # one record per transfer: ticket, version, seconds, error
        self._senders = ThreadPoolExecutor(concurrency, thread_name_prefix="raypost-weight-send")
        self._thread = threading.Thread(target=self._serve, name="raypost-weight-server", daemon=True)
        self._thread.start()

    def offer(self, version: int, specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]) -> None:
        """Make the tensors of ``specs`` the version that the next transfers send. They arrive in
        ``buckets`` (``specs``' order) and are copied into one flat CPU buffer as they come; the
        buffer replaces the last version's once complete (a transfer in flight keeps its own).
        The buffer is the version before last's when no transfer still sends it: its pages are
        warm, and a new one's page faults cost 4.7x the copy (benchmarks/weight_push.py)."""
        meta, offset = [], 0
        for spec in specs:
            meta.append((*spec, offset, nbytes(spec)))
            offset += nbytes(spec)
        with self._lock:
            buf, self._spare = self._spare, None
        if buf is None or buf.numel() != offset:
            buf = torch.empty(offset, dtype=torch.uint8)
        for i, flat in in_order(specs, buckets):
            buf[meta[i][3] : meta[i][3] + meta[i][4]] = flat
        with self._lock:
            old, self._offer = (
                self._offer,
                {"version": version, "meta": meta, "buckets": buckets_of(meta, self.bucket_bytes), "buf": buf},
            )
            self._retire(old)

    def _retire(self, offer: dict[str, Any] | None) -> None:
        """(Under the lock.) An offer that is no longer the newest: its buffer is the spare once
        no transfer sends it."""
        if offer is not None and offer is not self._offer and not self._sending.get(id(offer["buf"])):
            self._spare = offer["buf"]

    def stop(self) -> None:
        """Serve the tickets already taken, then end the threads (each transfer ends within ``timeout_s``)."""
        ticket = self.store.add("ticket", 1)
        self.store.set(f"req/{ticket}", json.dumps({STOP: True, "proof": proof(self.token, f"req/{ticket}")}))
        self._thread.join(timeout=self.timeout_s)
        self._senders.shutdown(wait=True, cancel_futures=False)

    def _log(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.sent = [*self.sent[-99:], record]

    def _serve(self) -> None:
        ticket = 1
        while True:
            req = self._next_request(ticket)
            if req is not None and not hmac.compare_digest(str(req.get("proof")), proof(self.token, f"req/{ticket}")):
                log.warning("weight server: ticket %d came without this run's token; refused", ticket)
                self._log({"ticket": ticket, "version": None, "error": "refused: no token"})
            elif req is not None and req.get(STOP):
                return
            elif req is not None:
                self._send(ticket, int(req["workers"]))
            ticket += 1

    def _next_request(self, ticket: int) -> dict[str, Any] | None:
        """The request filed under ``ticket`` (polled: a blocking wait would need a timeout that
        c10d logs each time); None when a later ticket exists and this one stayed empty too long."""
        key, since = f"req/{ticket}", None
        while not self.store.check([key]):
            if self.store.add("ticket", 0) > ticket:
                since = since or time.monotonic()
                if time.monotonic() - since > self.ticket_wait_s:
                    log.warning("weight server: ticket %d was taken but never filed; skipped", ticket)
                    return None
            time.sleep(0.02)
        try:
            req = json.loads(self.store.get(key))
        except ValueError:
            return {}
        return req if isinstance(req, dict) else {}

    def _send(self, ticket: int, workers: int) -> None:
        """Start sending the newest offer to ticket's replica on a sending thread: the offer is
        taken (and its buffer held) now, in ticket order."""
        with self._lock:
            offer = self._offer
            if offer is not None:
                self._sending[id(offer["buf"])] = self._sending.get(id(offer["buf"]), 0) + 1
        self._senders.submit(self._send_held, ticket, workers, offer)

    def _send_held(self, ticket: int, workers: int, offer: dict[str, Any] | None) -> None:
        try:
            self._send_offer(ticket, workers, offer)
        finally:
            if offer is not None:
                with self._lock:
                    key = id(offer["buf"])
                    self._sending[key] -= 1
                    if not self._sending[key]:
                        del self._sending[key]
                    self._retire(offer)

    def _send_offer(self, ticket: int, workers: int, offer: dict[str, Any] | None) -> None:
        t0, record = time.perf_counter(), {"ticket": ticket, "version": offer["version"] if offer else None}
        announced = False
        # A connection of this transfer's own: a TCPStore client serializes its calls, and gloo's
        # rendezvous waits on the store for up to timeout_s (a stalled replica would hold the rest).
        store = dist.TCPStore(
            self.address["host"], self.store.port, is_master=False, timeout=timedelta(seconds=self.timeout_s)
        )
        try:
            if offer is None:
                raise RuntimeError("a replica asked for weights before the first version was offered")
            header = {k: offer[k] for k in ("version", "meta", "buckets")}
            store.set(f"{scope(self.token, ticket)}/offer", json.dumps(header))
            announced = True
            if self.backend == "nccl":
                torch.cuda.set_device(self.device)  # this thread's NCCL device: the learner's
            group = _group(store, scope(self.token, ticket), 0, 1 + workers, self.backend, self.timeout_s)
            for lo, hi in offer["buckets"]:  # with NCCL, one bucket at a time on the GPU
                _broadcast(group, offer["buf"][lo:hi].to(self.device))
        except Exception as e:  # noqa: BLE001 - a receiver that died fails its own transfer only
            record["error"] = f"{type(e).__name__}: {e}"
            log.warning("weight server: transfer %d (version %s) failed: %s", ticket, record["version"], e)
            if not announced:  # the replica is waiting for the header: it fails now, not at its timeout
                store.set(f"{scope(self.token, ticket)}/offer", json.dumps({"error": record["error"]}))
        record["seconds"] = time.perf_counter() - t0
        self._log(record)


def request(address: Mapping[str, Any], workers: int, timeout_s: float = 120.0) -> dict[str, Any]:
    """A replica's side, before its workers receive: take a ticket and wait for the server to file
    the version it will send. Returns the ``source`` that the workers' ``receive`` takes."""
    store = dist.TCPStore(address["host"], address["port"], is_master=False, timeout=timedelta(seconds=timeout_s))
    ticket = store.add("ticket", 1)
    store.set(f"req/{ticket}", json.dumps({"workers": workers, "proof": proof(address["token"], f"req/{ticket}")}))
    header = json.loads(store.get(f"{scope(address['token'], ticket)}/offer"))  # waits while earlier tickets go
    if "error" in header:
        raise RuntimeError(f"learner rank 0's weight server could not send ticket {ticket}: {header['error']}")
    return {**address, "ticket": ticket, "workers": workers, "timeout_s": timeout_s, **header}


def receive(
    source: Mapping[str, Any], worker_rank: int, device: torch.device | str = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """An engine worker's side: join the ticket's group as rank ``1 + worker_rank`` and yield
    (name, tensor) for each bucket's tensors as the bucket arrives (views into that bucket)."""
    store = dist.TCPStore(
        source["host"], source["port"], is_master=False, timeout=timedelta(seconds=source["timeout_s"])
    )
    prefix = scope(source["token"], source["ticket"])
    group = _group(store, prefix, 1 + worker_rank, 1 + source["workers"], source["backend"], source["timeout_s"])
    meta = iter(source["meta"])
    pending = next(meta, None)
    for lo, hi in source["buckets"]:
        buf = torch.empty(hi - lo, dtype=torch.uint8, device=device)
        _broadcast(group, buf)
        while pending is not None and pending[3] < hi:
            name, dtype, shape, offset, nbytes = pending
            yield name, buf[offset - lo : offset - lo + nbytes].view(getattr(torch, dtype)).reshape(shape)
            pending = next(meta, None)


@register("collective")
class CollectiveChannel(WeightChannel):
    """Rank 0 keeps the newest version in (CPU) memory, the one copy it holds, and files its
    server's address with the board; a replica's engine workers receive it over a process group,
    bucket by bucket, and load it as it arrives. Any node, no file."""

    def __init__(
        self, settings: Any, key: str, workers: int = 1, bucket_mb: int = 64, timeout_s: float = 600.0
    ) -> None:
        super().__init__(settings, key, workers, bucket_mb, timeout_s)
        self._server: WeightServer | None = None

    def publish_stream(
        self, version: int, specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]
    ) -> None:
        import ray

        if self._server is None:  # NCCL when this learner has a GPU: the replicas' workers then receive on theirs
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            self._server = WeightServer(
                ray.util.get_node_ip_address(),
                backend,
                self.bucket_mb << 20,
                concurrency=self.settings.concurrent_transfers,
            )
        self._server.offer(version, specs, buckets)  # before the board names it: a replica never gets an older one
        self._record(version, [self._server.address])

    async def fetch(self, have: int) -> tuple[int, dict[str, Any] | None]:
        version, boxed = await self._latest()
        if version == have or boxed is None:
            return have, None
        source = await asyncio.to_thread(request, boxed[0], self.workers, self.timeout_s)
        return source["version"], {"transport": self.transport, **source}

    @staticmethod
    def tensors(source: Mapping[str, Any], worker: Any) -> Iterator[tuple[str, torch.Tensor]]:
        rank = getattr(worker, "rank", 0)  # the worker's rank among the replica's engine workers
        device = getattr(worker, "device", "cpu") if source["backend"] == "nccl" else "cpu"
        return receive(source, rank, device)

    def stop_serving(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
