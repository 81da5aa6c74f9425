"""A small HTTP/1.1 server for the gateway tests (Python standard library only).

usage: server.py NAME PORT [GATEWAY]

  GET /             "hello from NAME"
  GET /stream       three chunks, 700 ms apart (chunked)
  GET /ws           a WebSocket echo (text and binary frames)
  GET /call/SVC     calls service SVC through GATEWAY (host:port), forwarding
                    the `baggage` header as OpenTelemetry propagation would,
                    and answers "NAME>" + what SVC answered
  GET /headers      the request line's method and target, then the
                    request's headers, one per line
  POST              as GET (the body, if any, is not read)
"""
import base64
import hashlib
import http.client
import socketserver
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = sys.argv[1]
PORT = int(sys.argv[2])
GATEWAY = sys.argv[3] if len(sys.argv) > 3 else None
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_text(self, text, status=200):
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                chunk = f"chunk {i}\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                time.sleep(0.7)
            self.wfile.write(b"0\r\n\r\n")
        elif path == "/ws":
            self.websocket()
        elif path.startswith("/call/"):
            svc = path[len("/call/"):]
            host, port = GATEWAY.rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            headers = {"X-Mayfly-Service": svc}
            if self.headers.get("baggage"):
                headers["baggage"] = self.headers["baggage"]
            conn.request("GET", "/", headers=headers)
            answer = conn.getresponse().read().decode()
            self.send_text(f"{NAME}>{answer}")
        elif path == "/upload":
            # The body, chunked or not: its length and SHA-256.
            h = hashlib.sha256()
            n = 0
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        break
                    data = self.rfile.read(size)
                    self.rfile.readline()
                    h.update(data)
                    n += len(data)
            else:
                left = int(self.headers.get("Content-Length", "0"))
                while left > 0:
                    data = self.rfile.read(min(left, 65536))
                    if not data:
                        break
                    h.update(data)
                    n += len(data)
                    left -= len(data)
            self.send_text(f"{n} {h.hexdigest()}")
        elif path == "/headers":
            line = f"{self.command} {self.path}\n"
            self.send_text(line + "".join(f"{k.lower()}: {v}\n" for k, v in self.headers.items()))
        else:
            self.send_text(f"hello from {NAME}")

    do_POST = do_GET

    def websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        rfile = self.rfile
        while True:
            head = rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = struct.unpack(">H", rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", rfile.read(8))[0]
            mask = rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(rfile.read(length)))
            if opcode == 8:
                self.wfile.write(b"\x88\x00")
                return
            out = bytes([0x80 | opcode])
            if len(data) < 126:
                out += bytes([len(data)])
            else:
                out += bytes([126]) + struct.pack(">H", len(data))
            self.wfile.write(out + data)
            self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


socketserver.TCPServer.allow_reuse_address = True
Server(("127.0.0.1", PORT), Handler).serve_forever()
