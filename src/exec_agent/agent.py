# The exec agent: one long-lived process per computer (a Docker container or a Kubernetes pod)
# that runs the scripts this process sends it.
#
# Run as: python3 -I -S -c SOURCE rakazo-exec-agent (uid 1000, through one engine exec or one
# pods/exec whose stdin and stdout stay open). Each stdin line is a JSON request; each answer is
# one JSON line on stdout, written when its script ends, so scripts run side by side:
#   {"id": N, "run": HEX32, "script": S, "env": [[K, V], ...], "cwd": "/...", "timeout": SECS}
#     -> {"id": N, "code": C, "timed_out": B, "out": BASE64, "err": BASE64}
#     or {"id": N, "refused": REASON} when no process could start it (nothing ran).
#   {"op": "kill", "run": HEX32}   kills that script's process group; no answer.
#   {"id": N, "op": "ask", "helper": KEY, "argv": [...], "env": [[K, V], ...], "line": S,
#    "timeout": SECS}
#     -> {"id": N, "code": 0, "out": BASE64 of the helper's answer line}, or a non-zero code and
#        the helper's last words in "err" (timed_out when the deadline killed it).
# A helper is a long-lived program of the agent's (one per KEY, started by the first ask in a
# session of its own, stdin and stdout pipes) that answers each line it reads with one line; it
# is asked one line at a time, started again after it ends, and ends with the agent (its stdin
# closes).
# A script runs as `bash -c S` in a session of its own, stdin from /dev/null, its process group
# killed at the deadline. Its output comes through pipes: the first MiB of each stream is
# answered, the rest read and dropped. When the script's own process ends, what it wrote is
# answered at once; background processes it left behind may go on writing, and that is read
# and dropped until they end, so they never block, never get SIGPIPE and fill nothing.
# The script's pid is kept in /dev/shm/.rakazo-exec/RUN while it runs, where the fallback kill
# (one engine exec or pods/exec) finds it when the agent itself is gone. The first line written
# is {"ready": 1}; at the end of stdin the agent waits for the scripts under way (their deadlines
# still hold) and exits. With `--idle-exit SECS` after its name it also exits once no request
# has been under way for SECS: where nothing closes its stdin when this process goes (envd keeps
# an E2B sandbox's process input open), it does not outlive us for long.
# With `--listen PATH` (machines whose vendor keeps no process's input open) it speaks over the
# first connection to the unix socket PATH (in the screen gateway's directory, so the gateway
# carries it) instead: it prints a fresh 32-byte key in hex on stdout for the command that
# started it, leaves that command (a session of its own, standard streams on /dev/null), takes
# one connection and removes PATH. Every line each way then begins with its HMAC-SHA256 in hex
# and a space, over "q" (requests) or "a" (answers), the line's number in its direction (8 bytes,
# big-endian, from 0) and the line: whoever else reaches the socket (the bot, the same uid, can)
# can neither send a request nor put an answer in the agent's place. A line whose MAC is wrong
# ends the agent. Standard library only.

import base64
import ctypes
import hmac
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

PID_DIR = "/dev/shm/.rakazo-exec"
OUTPUT_CAP = 1 << 20
CHUNK = 1 << 16
PR_SET_DUMPABLE = 4

# How long a listening agent waits for its one connection.
ACCEPT_WITHIN = 30

out = sys.stdout.buffer
out_lock = threading.Lock()
running = {}
# Runs killed before they started (the kill overtook the request): never started. Bounded.
cancelled = {}
running_lock = threading.Lock()
# Requests under way, and when the last one came or ended (for `--idle-exit`).
busy = {"count": 0, "since": time.monotonic()}
busy_lock = threading.Lock()


def undumpable():
    """Closes /proc/<pid>/fd, environ and ptrace to other uid-1000 processes (the bot's)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def send(answer):
    line = (json.dumps(answer, separators=(",", ":")) + "\n").encode()
    with out_lock:
        try:
            out.write(line)
            out.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Drain(threading.Thread):
    """Reads and drops what background processes write to pipes whose script has ended."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        self.lock = threading.Lock()
        self.new = []

    def take(self, fd):
        with self.lock:
            self.new.append(fd)
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:
            pass

    def run(self):
        while True:
            for key, _ in self.sel.select():
                if key.fd == self.wake_r:
                    os.read(self.wake_r, 4096)
                    with self.lock:
                        new, self.new = self.new, []
                    for fd in new:
                        self.sel.register(fd, selectors.EVENT_READ)
                elif not os.read(key.fd, CHUNK):
                    self.sel.unregister(key.fd)
                    os.close(key.fd)


drain = Drain()


def exit_fd(child):
    """A file descriptor that turns readable when `child` ends."""
    try:
        return os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        r, w = os.pipe()

        def waiter():
            child.wait()
            os.write(w, b"x")
            os.close(w)

        threading.Thread(target=waiter, daemon=True).start()
        return r


def collect(child, streams, timeout):
    """Reads the script's output until its process ends (killing its group at the deadline);
    answers the exit code, whether the deadline passed, and the two outputs."""
    kept = {fd: bytearray() for fd in streams}
    ended = exit_fd(child)
    sel = selectors.DefaultSelector()
    sel.register(ended, selectors.EVENT_READ)
    for fd in streams:
        sel.register(fd, selectors.EVENT_READ)
    open_fds = set(streams)
    deadline = time.monotonic() + timeout
    expired = False

    def read(fd):
        data = os.read(fd, CHUNK)
        if not data:
            open_fds.discard(fd)
            return False
        room = OUTPUT_CAP - len(kept[fd])
        if room > 0:
            kept[fd] += data[:room]
        return True

    done = False
    while not done:
        wait = None if expired else max(deadline - time.monotonic(), 0)
        events = sel.select(wait)
        if not expired and time.monotonic() >= deadline:
            expired = True
            kill_group(child.pid)
        for key, _ in events:
            if key.fd == ended:
                done = True
            elif not read(key.fd):
                sel.unregister(key.fd)
    sel.close()
    os.close(ended)
    # What the script wrote before it ended is in the pipes now (a pipe's buffer at most): take
    # it without waiting, and no more than that if a background process writes on.
    for fd in list(open_fds):
        os.set_blocking(fd, False)
        try:
            for _ in range(16):
                if not read(fd):
                    break
        except BlockingIOError:
            pass
        if fd in open_fds:
            os.set_blocking(fd, True)
    code = child.wait()
    for fd in streams:
        if fd in open_fds:
            drain.take(fd)
        else:
            os.close(fd)
    code = 128 - code if code < 0 else code
    return code, expired, bytes(kept[streams[0]]), bytes(kept[streams[1]])


# Helpers by key; each asked by one request at a time (its lock). Bounded.
helpers = {}
helpers_lock = threading.Lock()
MAX_HELPERS = 64


class Helper:
    def __init__(self, argv, env):
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
            env=env,
            start_new_session=True,
        )

    def end(self):
        """Kills the helper and reads its last words."""
        kill_group(self.proc.pid)
        self.proc.wait()
        try:
            return self.proc.stderr.read(4096)
        except (OSError, ValueError):
            return b""
        finally:
            for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                try:
                    f.close()
                except OSError:
                    pass


def helper_for(req):
    """The live helper of the request's key, started if it has none."""
    key = req["helper"]
    with helpers_lock:
        helper = helpers.get(key)
        if helper is not None and helper.proc.poll() is None:
            return helper
        env = dict(os.environ)
        env.update((k, v) for k, v in req["env"])
        helper = Helper(req["argv"], env)
        helpers.pop(key, None)
        while len(helpers) >= MAX_HELPERS:
            threading.Thread(target=helpers.pop(next(iter(helpers))).end).start()
        helpers[key] = helper
        return helper


def ask(req):
    answer = {"id": req["id"], "code": 0, "timed_out": False, "out": "", "err": ""}
    try:
        helper = helper_for(req)
    except OSError as e:
        answer.update(code=127, err=b64(("rakazo-exec: cannot start the helper: %s\n" % e.strerror).encode()))
        send(answer)
        return
    with helper.lock:
        expired = threading.Event()

        def overdue():
            expired.set()
            kill_group(helper.proc.pid)

        timer = threading.Timer(float(req["timeout"]), overdue)
        timer.start()
        try:
            helper.proc.stdin.write(req["line"].encode() + b"\n")
            helper.proc.stdin.flush()
            line = helper.proc.stdout.readline(OUTPUT_CAP + 1)
        except (OSError, ValueError):
            line = b""
        finally:
            timer.cancel()
        if line.endswith(b"\n"):
            answer["out"] = b64(line[:-1])
        else:
            # Ended, killed at the deadline, or an answer past the cap: given up.
            with helpers_lock:
                if helpers.get(req["helper"]) is helper:
                    del helpers[req["helper"]]
            answer.update(code=1, timed_out=expired.is_set(), err=b64(helper.end()))
    send(answer)


def b64(data):
    return base64.b64encode(data).decode()


def run(req):
    rid = req["run"]
    answer = {"id": req["id"], "code": 137, "timed_out": False, "out": "", "err": ""}
    with running_lock:
        if cancelled.pop(rid, None):
            send(answer)
            return
    env = dict(os.environ)
    env.update((k, v) for k, v in req["env"])
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        child = subprocess.Popen(
            ["bash", "-c", req["script"]],
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            cwd=req["cwd"],
            env=env,
            start_new_session=True,
        )
    except OSError as e:
        for fd in (out_r, err_r):
            os.close(fd)
        if e.filename != req["cwd"]:
            # No process to run it (the machine's process limit, say): refused, not run.
            send({"id": req["id"], "refused": e.strerror or type(e).__name__})
            return
        # As the engine answers an exec whose working directory it cannot enter.
        answer["code"] = 126
        answer["err"] = b64(
            ("rakazo-exec: cannot run in %s: %s\n" % (req["cwd"], e.strerror)).encode()
        )
        send(answer)
        return
    finally:
        os.close(out_w)
        os.close(err_w)
    pid_file = os.path.join(PID_DIR, rid)
    with running_lock:
        running[rid] = child.pid
        if cancelled.pop(rid, None):
            kill_group(child.pid)
    try:
        with open(pid_file, "w") as f:
            f.write("%d\n" % child.pid)
    except OSError:
        pid_file = None
    try:
        code, expired, stdout, stderr = collect(child, [out_r, err_r], float(req["timeout"]))
    finally:
        with running_lock:
            running.pop(rid, None)
        if pid_file:
            try:
                os.unlink(pid_file)
            except OSError:
                pass
    answer.update(code=code, timed_out=expired, out=b64(stdout), err=b64(stderr))
    send(answer)


def serve(req):
    try:
        if req.get("op") == "ask":
            ask(req)
        else:
            run(req)
    except Exception as e:  # a request the agent could not run still gets its answer
        send({"id": req.get("id"), "error": type(e).__name__})
    finally:
        with busy_lock:
            busy["count"] -= 1
            busy["since"] = time.monotonic()


def exit_when_idle(idle):
    """Ends the agent once no request was under way for `idle` seconds."""
    while True:
        with busy_lock:
            left = idle - (time.monotonic() - busy["since"])
            if busy["count"] == 0 and left <= 0:
                os._exit(0)
            wait = min(max(left, 0.05), 1.0) if busy["count"] == 0 else 1.0
        time.sleep(wait)


def arg(name):
    """The value after `name` among the arguments, or None."""
    args = sys.argv[1:]
    if name in args[:-1]:
        return args[args.index(name) + 1]
    return None


def idle_exit_arg():
    """SECS of `--idle-exit SECS`, or None."""
    value = arg("--idle-exit")
    try:
        return None if value is None else max(0.1, float(value))
    except ValueError:
        return None


def mac(key, direction, number, line):
    return hmac.digest(key, direction + number.to_bytes(8, "big") + line, "sha256").hex().encode()


class SealedOut:
    """The answers' side of a listening agent's connection: each line sealed with its MAC."""

    def __init__(self, conn, key):
        self.file = conn.makefile("wb")
        self.key = key
        self.number = 0

    def write(self, line):
        body = line.rstrip(b"\n")
        self.file.write(mac(self.key, b"a", self.number, body) + b" " + body + b"\n")
        self.number += 1

    def flush(self):
        self.file.flush()


def sealed_lines(conn, key):
    """The requests of a listening agent's connection, each checked against its MAC; a line
    whose MAC is wrong ends the agent."""
    number = 0
    for line in conn.makefile("rb"):
        sealed, _, body = line.rstrip(b"\n").partition(b" ")
        if not hmac.compare_digest(sealed, mac(key, b"q", number, body)):
            os._exit(3)
        number += 1
        yield body


def listen(path):
    """Listens on `path`, hands the key to the starting command and leaves it; the requests of
    the one connection (see the header)."""
    global out
    key = os.urandom(32)
    try:
        os.unlink(path)
    except OSError:
        pass
    old = os.umask(0o077)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.umask(old)
    server.listen(1)
    if os.fork():
        sys.stdout.write(key.hex() + "\n")
        sys.stdout.flush()
        os._exit(0)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    server.settimeout(ACCEPT_WITHIN)
    try:
        conn, _ = server.accept()
    except OSError:
        os._exit(0)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        server.close()
    conn.settimeout(None)
    out = SealedOut(conn, key)
    return sealed_lines(conn, key)


def main():
    undumpable()
    path = arg("--listen")
    lines = listen(path) if path else sys.stdin.buffer
    try:
        os.makedirs(PID_DIR, mode=0o700, exist_ok=True)
    except OSError:
        pass
    drain.start()
    idle = idle_exit_arg()
    if idle is not None:
        threading.Thread(target=exit_when_idle, args=(idle,), daemon=True).start()
    send({"ready": 1})
    for line in lines:
        with busy_lock:
            busy["since"] = time.monotonic()
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if req.get("op") == "kill":
            with running_lock:
                pid = running.get(req.get("run"))
                if not pid:
                    cancelled[req.get("run")] = True
                    while len(cancelled) > 1024:
                        cancelled.pop(next(iter(cancelled)))
            if pid:
                kill_group(pid)
            continue
        with busy_lock:
            busy["count"] += 1
        try:
            threading.Thread(target=serve, args=(req,)).start()
        except RuntimeError:
            # No thread to run it (the machine's process limit): refused, the agent goes on.
            with busy_lock:
                busy["count"] -= 1
            send({"id": req.get("id"), "refused": "no thread to run it"})


main()
