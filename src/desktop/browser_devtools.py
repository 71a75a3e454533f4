"""Speaks to a bot's Chromium through its DevTools port, inside the computer (standard library only).

usage: browser_devtools.py <profile dir> close|save|load

close  quits the browser the way a person would (Browser.close), so it writes its databases.
save   writes the browser's cookies (Storage.getCookies) to COOKIES in the profile, sorted, and
       only when they differ from what the file holds, so an unchanged browser changes nothing;
       prints "written" or "same".
load   gives the cookies of COOKIES back to the browser (Storage.setCookies); connects even
       without any, since the first connection makes Chromium rewrite its preferences.

Exit codes: 0 done, 2 no DevTools endpoint, 3 DevTools refused, 4 bad reply.
Everything in the profile is the workspace user's: files are opened without following links
and read with a cap.
"""
import base64
import json
import os
import socket
import stat
import struct
import sys
import time

COOKIES = "Saved Cookies.json"
FILE_CAP = 64 << 20
REPLY_CAP = 64 << 20


def read_file(path, cap):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        data = f.read(cap + 1)
    if len(data) > cap:
        raise OSError("too large")
    return data


def recv_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise OSError("closed")
        out += chunk
    return out


class DevTools:
    def __init__(self, profile, wait=0.0):
        # A browser that has just started may not have written its port yet.
        deadline = time.monotonic() + wait
        while True:
            try:
                lines = read_file(os.path.join(profile, "DevToolsActivePort"), 4096).decode().split()
                port, path = int(lines[0]), lines[1]
                self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
                break
            except (OSError, ValueError, IndexError):
                if time.monotonic() >= deadline:
                    sys.exit(2)
                time.sleep(0.1)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                        "Sec-WebSocket-Version: 13\r\n\r\n" % (path, port, key)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.s.recv(4096)
            if not chunk or len(head) > 65536:
                sys.exit(3)
            head += chunk
        if b" 101 " not in head.split(b"\r\n")[0]:
            sys.exit(3)
        self.buffered = head.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0

    def recv(self, n):
        if self.buffered:
            take, self.buffered = self.buffered[:n], self.buffered[n:]
            return take + (recv_exact(self.s, n - len(take)) if len(take) < n else b"")
        return recv_exact(self.s, n)

    def send(self, method, params=None, wait=True):
        self.next_id += 1
        body = json.dumps({"id": self.next_id, "method": method, "params": params or {}}).encode()
        n = len(body)
        if n < 126:
            head = bytes([0x81, 0x80 | n])
        elif n < 65536:
            head = bytes([0x81, 0x80 | 126]) + struct.pack(">H", n)
        else:
            head = bytes([0x81, 0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.s.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(body)))
        if not wait:
            return None
        while True:
            reply = self.message()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    sys.exit(4)
                return reply.get("result", {})

    def message(self):
        data = b""
        while True:
            b0, b1 = self.recv(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self.recv(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.recv(8))[0]
            if b1 & 0x80:
                raise OSError("masked frame from the browser")
            if len(data) + n > REPLY_CAP:
                sys.exit(4)
            payload = self.recv(n)
            opcode = b0 & 0x0F
            if opcode == 8:
                raise OSError("closed")
            if opcode in (0, 1, 2):
                data += payload
                if b0 & 0x80:
                    return json.loads(data)


# The fields of a cookie Storage.setCookies takes back.
FIELDS = ("name", "value", "domain", "path", "secure", "httpOnly", "sameSite", "priority",
          "sourceScheme", "sourcePort", "partitionKey")


def canonical(cookies):
    out = []
    for c in cookies:
        kept = {k: c[k] for k in FIELDS if k in c}
        if not c.get("session") and isinstance(c.get("expires"), (int, float)) and c["expires"] > 0:
            kept["expires"] = c["expires"]
        out.append(kept)
    out.sort(key=lambda c: (c.get("domain", ""), c.get("path", ""), c.get("name", ""),
                            json.dumps(c.get("partitionKey"), sort_keys=True)))
    return (json.dumps(out, sort_keys=True, indent=0) + "\n").encode()


def save(profile):
    cookies = DevTools(profile).send("Storage.getCookies").get("cookies")
    if not isinstance(cookies, list):
        sys.exit(4)
    data = canonical(cookies)
    path = os.path.join(profile, COOKIES)
    try:
        if read_file(path, FILE_CAP) == data:
            print("same")
            return
    except OSError:
        pass
    tmp = os.path.join(profile, ".%s.%s" % (COOKIES, os.urandom(8).hex()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    print("written")


def load(profile):
    try:
        cookies = json.loads(read_file(os.path.join(profile, COOKIES), FILE_CAP))
    except (OSError, ValueError):
        cookies = []
    if not isinstance(cookies, list):
        cookies = []
    cookies = [c for c in cookies if isinstance(c, dict)]
    # Asked right after the browser's start: it writes its port when it is ready.
    tools = DevTools(profile, wait=30)
    if cookies:
        tools.send("Storage.setCookies", {"cookies": cookies})
    else:
        # Chromium rewrites its preferences on its first DevTools connection: better now, at
        # its start, than at the first checkpoint, where it would look like a change.
        tools.send("Browser.getVersion")


def close(profile):
    tools = DevTools(profile)
    tools.send("Browser.close", wait=False)
    try:
        tools.s.recv(4096)
    except OSError:
        pass


def main():
    profile, action = sys.argv[1], sys.argv[2]
    try:
        {"close": close, "save": save, "load": load}[action](profile)
    except (OSError, ValueError, KeyError):
        sys.exit(4)


main()
