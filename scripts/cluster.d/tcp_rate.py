#!/usr/bin/env python3
"""Measures a TCP link's rate for `scripts/cluster selftest` (standard library only).

  tcp_rate.py receive --port-fifo FIFO   listen on an ephemeral port, write the port to FIFO, take one
                                         connection, read to EOF, print "BYTES SECONDS" (the time
                                         from the first byte to EOF)
  tcp_rate.py send HOST PORT SECONDS     connect to HOST:PORT by name and send as fast as the link
                                         takes for SECONDS, then close

The receiver times the transfer, so what it prints is what crossed the link: the payload rate, a
few percent under the tbf rate, which also counts the headers.
"""
import argparse
import socket
import sys
import time

CHUNK = 256 * 1024


def receive(port_fifo):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen(1)
        listener.settimeout(30)
        with open(port_fifo, "w") as fifo:
            fifo.write(f"{listener.getsockname()[1]}\n")
        conn, _ = listener.accept()
    with conn:
        conn.settimeout(30)
        total = 0
        first = None
        while True:
            data = conn.recv(CHUNK)
            if not data:
                break
            if first is None:
                first = time.monotonic()
            total += len(data)
        end = time.monotonic()
    if first is None or end <= first:
        sys.exit("tcp_rate: received nothing")
    print(f"{total} {end - first:.6f}")


def send(host, port, seconds):
    payload = b"\0" * CHUNK
    with socket.create_connection((host, port), timeout=30) as conn:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # wait for the receiver's close: every byte has crossed the link


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("receive")
    r.add_argument("--port-fifo", required=True)
    s = sub.add_parser("send")
    s.add_argument("host")
    s.add_argument("port", type=int)
    s.add_argument("seconds", type=float)
    args = parser.parse_args()
    if args.command == "receive":
        receive(args.port_fifo)
    else:
        send(args.host, args.port, args.seconds)


if __name__ == "__main__":
    main()
