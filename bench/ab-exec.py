#!/usr/bin/env python3
"""A/B of two `mayfly` binaries on the exec round trip over the API.

    python3 bench/ab-exec.py OLD_BINARY NEW_BINARY [ROUNDS]

Starts one daemon of each binary (own socket and state directory), creates
one sandbox in each, then execs `true` in them alternately over kept-alive
unix-socket connections (the first of each round alternates too), timing
each call from request to response. Prints both medians (and the daemons'
own `duration_us`) and the median of the per-round ratios NEW/OLD. Run as
root, on an otherwise idle host.
"""
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def request(sock, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: mayfly\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n")
    sock.sendall(head.encode() + data)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            sys.exit("the daemon closed the connection")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += sock.recv(65536)
    if not head.startswith(b"HTTP/1.1 2"):
        sys.exit(f"{method} {path}: {head.splitlines()[0].decode()} {rest.decode(errors='replace')}")
    return json.loads(rest) if rest else None


def start(binary, root):
    sock_path = f"{root}/mayfly.sock"
    proc = subprocess.Popen([binary, "--socket", sock_path, "--state-dir", f"{root}/state", "serve"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock_path)
            return proc, s
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit(f"{binary} did not start serving")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    old, new = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 400
    with tempfile.TemporaryDirectory(prefix="mayfly-ab-") as tmp:
        procs, socks, ids = {}, {}, {}
        try:
            for name, binary in (("old", old), ("new", new)):
                procs[name], socks[name] = start(binary, f"{tmp}/{name}")
                ids[name] = request(socks[name], "POST", "/v1/sandboxes", {})["id"]
            api = {"old": [], "new": []}
            own = {"old": [], "new": []}
            for i in range(rounds):
                for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
                    t = time.perf_counter()
                    r = request(socks[name], "POST", f"/v1/sandboxes/{ids[name]}/exec", {"argv": ["true"]})
                    api[name].append((time.perf_counter() - t) * 1e3)
                    own[name].append(r["duration_us"] / 1e3)
            for name in ids:
                request(socks[name], "DELETE", f"/v1/sandboxes/{ids[name]}")
        finally:
            for p in procs.values():
                p.terminate()
                p.wait()
    med = statistics.median
    ratio = med([n / o for o, n in zip(api["old"], api["new"])])
    print(f"old: API {med(api['old']):.3f} ms (daemon {med(own['old']):.3f}); "
          f"new: API {med(api['new']):.3f} ms (daemon {med(own['new']):.3f}); "
          f"new/old per-round median {ratio:.3f} ({rounds} rounds)")


if __name__ == "__main__":
    main()
