"""A hostile client for the mccl listen ports: connections that carry garbage or pretend to be a rank.

Each connection sends one payload (see `payload`), half-closes its side (so a server waiting for more
bytes sees end-of-file at once; "stall" excepted: it sends 3 bytes and holds the connection open like a
slow-loris client until released), and then watches what the server does with it:

    refused       nobody listens there (the mccl listener is closed outside rendezvous)
    closed        the server closed the connection (end-of-file or reset) without sending anything
    replied       the server sent bytes, then closed the connection
    open          the server kept the connection open for WAIT_S after the payload: it took the client
                  for a peer (or stalls on it); counted as accepted (see garbage_trials.accepted)
    held          ("stall" only) the server still had the stalled connection open when it was released
    timeout       the TCP connect itself did not complete within CONNECT_TIMEOUT_S (backlog full)
    error         anything else (recorded with its text)

The payloads are written against the wire format of csrc/engine/wire.h (protocol version 4: the 80-byte
Hello with its nonce, lane, lane count and allreduce settings; the 64-byte frame header; magic "MCCL") as an attacker who
read the source would know it, not through the engine's code. "impersonate" is the unauthenticated client
that matters: a well-formed Hello with the job's real communicator id (an attacker on the LAN reads it off
any frame header; the harness takes it from the store) and default settings, claiming to be a rank that
has not connected yet. The server answers with its own Hello (its challenge) and then reads a frame header
where the proof belongs: without authentication the server would take it for that rank; with the per-job
challenge-response it must be closed like the rest.
"""
from __future__ import annotations

import errno
import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

MAGIC = 0x4C43434D
VERSION = 4
CONNECTOR = 1  # HandshakeRole::kConnector
CONNECT_TIMEOUT_S = 2.0
WAIT_S = 2.0
STALL_LIMIT_S = 120.0  # a stalled connection is held at most this long
# What a socket call reports once the server has closed (reset) the connection.
CLOSED_ERRNOS = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN)  # longer than the engine's 10 s handshake limit


def hello(comm_id: int, rank: int, world: int, magic: int = MAGIC, version: int = VERSION) -> bytes:
    """The Hello of wire.h: magic u32, version u16, role u16, comm_id u64, rank u32, world_size u32, nonce 32
    bytes, lane u16, nsocks u16, 4 reserved bytes, rd_max_bytes u64, algo u8, selection 4 bytes (0: default
    algorithm settings), 3 reserved bytes (80 in all)."""
    return struct.pack("<IHHQII32sHH4xQB7x", magic, version, CONNECTOR, comm_id & (2**64 - 1), rank & (2**32 - 1),
                       world & (2**32 - 1), bytes(range(32)), 0, 1, 0, 0)


def frame_header(comm_id: int, *, length: int, channel: int = 1, kind: int = 1, seq: int = 0, count: int = 0) -> bytes:
    """The 64-byte FrameHeader of wire.h with an arbitrary payload length."""
    return struct.pack("<IHBBQQBBHIQQQII", MAGIC, VERSION, channel, kind, comm_id & (2**64 - 1), seq, 1, 1, 0, 0,
                       count, 0, length & (2**64 - 1), 0, 0)


@dataclass
class Target:
    """One listen address, with what an attacker could know about its job."""

    host: str
    port: int
    rank: int
    world: int
    comm_id: int = 0
    missing_rank: int | None = None  # a rank that has not connected to this one yet (to impersonate)


def payload(kind: str, t: Target, rng: random.Random) -> bytes:
    if kind == "empty":
        return b""
    if kind == "random":
        return rng.randbytes(rng.randint(1, 512))
    if kind == "oversized":
        return rng.randbytes(rng.randint(64 << 10, 1 << 20))
    if kind == "http":
        return b"GET / HTTP/1.1\r\nHost: mccl\r\nUser-Agent: scanner\r\n\r\n"
    if kind == "bad_magic":
        return hello(t.comm_id, t.world - 1, t.world, magic=rng.getrandbits(32) | 1)
    if kind == "wrong_version":
        return hello(t.comm_id, t.world - 1, t.world, version=rng.choice([0, 1, 2, 3, 99, 0xFFFF]))
    if kind == "truncated":
        return hello(t.comm_id, t.world - 1, t.world)[: rng.randint(1, 79)]
    if kind == "wrong_comm":
        return hello(rng.getrandbits(64) | 1, t.world - 1, t.world)
    if kind == "bad_rank":
        return hello(t.comm_id, rng.choice([t.world, 2**31, 2**32 - 1]), t.world)
    if kind == "huge_length":  # a frame header where a Hello belongs, announcing 2^40..2^63 bytes
        return frame_header(t.comm_id, length=1 << rng.randint(40, 63))
    if kind == "impersonate":  # a perfect Hello for a missing rank, then a frame announcing a huge payload
        rank = t.missing_rank if t.missing_rank is not None else t.world - 1
        return hello(t.comm_id, rank, t.world) + frame_header(t.comm_id, length=1 << 62, count=1 << 60)
    if kind == "stall":
        return hello(t.comm_id, t.world - 1, t.world)[:3]
    raise ValueError(f"unknown garbage kind {kind!r}")


# Garbage: what a port scanner, a confused program or a corrupted stream sends. Closed at once, whatever
# the job's authentication.
BASIC_KINDS = ("empty", "random", "oversized", "http", "bad_magic", "wrong_version", "truncated", "wrong_comm",
               "bad_rank", "huge_length")
# The two attacks the harness runs as trials of their own (see garbage_trials): a client that knows the
# communicator id and claims a rank, and one that opens a handshake and never finishes it.
ALL_KINDS = BASIC_KINDS + ("impersonate", "stall")


def send_payload(kind: str, t: Target, rng: random.Random):
    """Connects and sends kind's payload; returns (record, socket or None when it is already decided)."""
    rec = {"kind": kind, "target": f"{t.host}:{t.port}", "rank": t.rank, "local": None, "detail": ""}
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(CONNECT_TIMEOUT_S)
        try:
            s.connect((t.host, t.port))
        except ConnectionRefusedError:
            rec["outcome"] = "refused"
        except (socket.timeout, TimeoutError):
            rec["outcome"] = "timeout"
        else:
            rec["local"] = "%s:%d" % s.getsockname()[:2]
            s.settimeout(WAIT_S)
            s.sendall(payload(kind, t, rng))
            if kind != "stall":
                s.shutdown(socket.SHUT_WR)
            return rec, s
    except OSError as e:  # the server closed on us while we were still sending: that is a close
        rec["outcome"] = "closed" if e.errno in CLOSED_ERRNOS else "error"
        rec["detail"] = "closed while the client was sending" if e.errno in CLOSED_ERRNOS else f"{e!r}"
    s.close()
    return rec, None


def watch(rec: dict, s: socket.socket, release: threading.Event | None = None) -> dict:
    """What the server does with the connection after the payload (sets rec["outcome"]); closes it.
    A "stall" connection is held until `release` is set: "held" if the server still had it open then."""
    try:
        if rec["kind"] == "stall":
            rec["outcome"], rec["detail"] = _hold(s, release or threading.Event())
        else:
            rec["outcome"], rec["detail"] = _watch(s, WAIT_S)
    except OSError as e:
        rec["outcome"], rec["detail"] = "error", f"{e!r}"
    finally:
        s.close()
    return rec


def attempt(kind: str, t: Target, rng: random.Random, release: threading.Event | None = None) -> dict:
    """One connection, start to end; returns {"kind", "target", "rank", "outcome", "local", "detail"}."""
    rec, s = send_payload(kind, t, rng)
    return rec if s is None else watch(rec, s, release)


def _hold(s: socket.socket, release: threading.Event):
    """Keeps a stalled connection open until `release` (or STALL_LIMIT_S); ("held"|"closed", detail)."""
    t0 = time.monotonic()
    while not release.wait(0.05):
        if time.monotonic() - t0 > STALL_LIMIT_S:
            break
        s.settimeout(0.0)
        try:
            chunk = _recv_or_closed(s)
        except BlockingIOError:
            continue
        if not chunk:
            return "closed", f"the server closed it after {time.monotonic() - t0:.1f} s"
    return "held", f"still open when released after {time.monotonic() - t0:.1f} s"


def _recv_or_closed(s: socket.socket) -> bytes:
    """s.recv(), with b"" when the server closed or reset the connection; other errors (including a
    timeout or "would block") are raised."""
    try:
        return s.recv(65536)
    except OSError as e:
        if e.errno not in CLOSED_ERRNOS or isinstance(e, (BlockingIOError, socket.timeout)):
            raise
        return b""


def _watch(s: socket.socket, wait_s: float):
    """What the server does within wait_s: ("closed"|"replied"|"open", detail)."""
    got = 0
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return "open", f"still open after {wait_s:g} s ({got} bytes received)"
        s.settimeout(left)
        try:
            chunk = _recv_or_closed(s)
        except (socket.timeout, TimeoutError):
            continue
        if not chunk:
            return ("replied", f"{got} bytes, then closed") if got else ("closed", "")
        got += len(chunk)


@dataclass
class Flood:
    """`count` connections to the targets (from `targets_fn()`) from `threads` threads, each of a kind drawn
    at random from `kinds`. Stalled connections get a thread of their own and stay open until release()."""

    targets_fn: object  # callable returning the current list of Target
    count: int
    kinds: tuple = BASIC_KINDS
    seed: int = 0
    threads: int = 8
    records: list = field(default_factory=list)

    def __post_init__(self):
        self._lock = threading.Lock()
        self._issued = 0
        self._stop = threading.Event()
        self._release = threading.Event()
        self._threads = []
        self._held = []

    def start(self) -> "Flood":
        for i in range(self.threads):
            th = threading.Thread(target=self._run, args=(random.Random(self.seed * 1000 + i),), daemon=True)
            th.start()
            self._threads.append(th)
        return self

    def stop(self) -> None:
        """No new connections after the ones in flight."""
        self._stop.set()

    def join(self, timeout: float) -> bool:
        """Waits for every connection but the stalled ones; True when all are done."""
        deadline = time.monotonic() + timeout
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        return not any(th.is_alive() for th in self._threads)

    def release(self, timeout: float = 10.0) -> None:
        """Closes the stalled connections and waits for their records."""
        self._stop.set()
        self._release.set()
        deadline = time.monotonic() + timeout
        for th in self._held:
            th.join(max(0.0, deadline - time.monotonic()))

    def _next(self, rng):
        targets = self.targets_fn()
        with self._lock:
            if self._issued >= self.count or self._stop.is_set():
                return "done"
            if not targets:
                return None
            self._issued += 1
            return rng.choice(targets), rng.choice(self.kinds)

    def _record(self, rec) -> None:
        with self._lock:
            self.records.append(rec)

    def _run(self, rng):
        while True:
            job = self._next(rng)
            if job == "done":
                return
            if job is None:  # no target published yet
                time.sleep(0.01)
                continue
            target, kind = job
            try:
                rec, s = send_payload(kind, target, rng)
            except Exception as e:  # noqa: BLE001 - a harness bug must show in the tally, not vanish
                rec, s = {"kind": kind, "target": str(target), "rank": target.rank, "local": None,
                          "outcome": "error", "detail": repr(e)}, None
            if s is None:
                self._record(rec)
            elif kind == "stall":  # held open by a thread of its own until release()
                th = threading.Thread(target=lambda: self._record(watch(rec, s, self._release)), daemon=True)
                th.start()
                with self._lock:
                    self._held.append(th)
            else:
                self._record(watch(rec, s))


def tally(records) -> dict:
    """{"total", "by_outcome": {...}, "by_kind": {kind: {outcome: n}}}."""
    by_kind: dict = {}
    for r in records:
        by_kind.setdefault(r["kind"], Counter())[r["outcome"]] += 1
    return {"total": len(records), "by_outcome": dict(Counter(r["outcome"] for r in records)),
            "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())}}
