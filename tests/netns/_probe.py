"""What the netns tests run inside emulated hosts (by path, standard library only).

serve PORT               UDP on PORT: echo datagrams that start with ``p``, count
                         every datagram by sender; print ``ready``, then the
                         counts (JSON) for each line read on stdin; exit on EOF
ping ADDR PORT N WAIT    N echo round trips, one at a time, each waited for up to
                         WAIT seconds; prints {"received": n, "rtt_ms": [...]}
blast ADDR PORT N        send N datagrams that are not echoed, 50 at a time
tcp ADDR PORT            connect, send a line, print what comes back
tcp-serve PORT           print ``ready``, answer one connection's line upper-cased
clock                    print ``ready``; for each line read on stdin, sleep 10 ms
                         (time.sleep must work under libfaketime) and print time.time()
"""

from __future__ import annotations

import json
import select
import socket
import sys
import time

# 4 MiB (SO_RCVBUFFORCE: root passes rmem_max): a burst of a blast is never
# dropped by the socket, so what a count misses the network lost.
RCVBUF = 4 << 20
SO_RCVBUFFORCE = 33  # Linux's; the socket module does not name it
BURST = 50


def serve(port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
    sock.bind(("0.0.0.0", port))
    counts: dict[str, int] = {}
    print("ready", flush=True)
    while True:
        ready = select.select([sock, sys.stdin], [], [])[0]
        if sock in ready:
            data, peer = sock.recvfrom(2048)
            counts[peer[0]] = counts.get(peer[0], 0) + 1
            if data.startswith(b"p"):
                sock.sendto(data, peer)
        if sys.stdin in ready:
            if not sys.stdin.readline():
                return
            print(json.dumps(counts), flush=True)


def ping(address: str, port: int, count: int, wait: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rtts = []
    for n in range(count):
        payload = f"p{n}".encode()
        start = time.monotonic()
        sock.sendto(payload, (address, port))
        deadline = start + wait
        while (left := deadline - time.monotonic()) > 0:
            if select.select([sock], [], [], left)[0] and sock.recv(2048) == payload:
                rtts.append((time.monotonic() - start) * 1000)
                break
    print(json.dumps({"received": len(rtts), "rtt_ms": rtts}))


def blast(address: str, port: int, count: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for n in range(count):
        sock.sendto(f"b{n}".encode(), (address, port))
        if n % BURST == BURST - 1:
            time.sleep(0.001)  # lets the receiver drain its socket


def tcp(address: str, port: int) -> None:
    with socket.create_connection((address, port), timeout=10) as conn:
        conn.sendall(b"hello over tcp\n")
        print(conn.makefile().readline().strip())


def tcp_serve(port: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as server:
        print("ready", flush=True)
        conn, _ = server.accept()
        with conn:
            conn.sendall(conn.makefile().readline().upper().encode())


def clock() -> None:
    print("ready", flush=True)
    while sys.stdin.readline():
        time.sleep(0.01)  # the behaviour under test: a sleep under libfaketime's clock
        print(time.time(), flush=True)


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "serve":
        serve(int(args[0]))
    elif command == "ping":
        ping(args[0], int(args[1]), int(args[2]), float(args[3]))
    elif command == "blast":
        blast(args[0], int(args[1]), int(args[2]))
    elif command == "tcp":
        tcp(args[0], int(args[1]))
    elif command == "tcp-serve":
        tcp_serve(int(args[0]))
    elif command == "clock":
        clock()
    else:
        raise SystemExit(f"unknown command {command!r}\n{__doc__}")


if __name__ == "__main__":
    main(sys.argv[1:])
