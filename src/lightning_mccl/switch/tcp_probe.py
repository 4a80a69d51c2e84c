"""A bulk TCP sender and receiver (standard library only) that measure a link's goodput when iperf3 is absent.

    python tcp_probe.py recv --bind 10.213.0.2 [--skip 0.5]     # prints {"port": P}, then the result
    python tcp_probe.py send --to 10.213.0.2 --port P --seconds 3

The receiver counts the bytes that arrive after the first `skip` seconds (TCP slow start and the token
bucket's initial burst excluded) until the sender closes, and prints one JSON line:
``{"bytes": ..., "seconds": ..., "bits_per_second": ...}``. Run as a file (not `-m`), so starting it
imports nothing but the standard library.
"""
import argparse
import json
import socket
import sys
import time

CHUNK = 1 << 20
ACCEPT_TIMEOUT_S = 30.0


def receive(bind, skip):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind((bind, 0))
    srv.listen(1)
    print(json.dumps({"port": srv.getsockname()[1]}), flush=True)
    srv.settimeout(ACCEPT_TIMEOUT_S)
    conn, _ = srv.accept()
    conn.settimeout(ACCEPT_TIMEOUT_S)
    buf = bytearray(CHUNK)
    total, first, mark, last = 0, None, None, None
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        last = time.perf_counter()
        if first is None:
            first = last
        total += n
        if mark is None and last - first >= skip:
            mark = (last, total)
    conn.close()
    if mark is None or last <= mark[0]:
        raise SystemExit(f"tcp_probe: only {total} bytes in {0 if first is None else last - first:.2f} s: "
                         f"run it longer than --skip {skip}")
    seconds = last - mark[0]
    nbytes = total - mark[1]
    print(json.dumps({"bytes": nbytes, "seconds": seconds, "bits_per_second": nbytes * 8 / seconds}), flush=True)


def send(to, port, seconds):
    s = socket.create_connection((to, port), timeout=ACCEPT_TIMEOUT_S)
    data = b"\0" * CHUNK
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # the receiver's close
    s.close()


def main(argv=None):
    p = argparse.ArgumentParser(prog="tcp_probe")
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    r.add_argument("--skip", type=float, default=0.5)
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)
    if args.mode == "recv":
        receive(args.bind, args.skip)
    else:
        send(args.to, args.port, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
