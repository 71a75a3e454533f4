# The computer's terminal server: one PTY shell per connection on a unix socket, speaking Rakazo's terminal frames.
#
# Run as: python3 terminal_server.py <socket path> <session dir>
# in the working directory and environment the shell should have (the shell tool's). The
# screen gateway (websockify) relays a browser's websocket to the socket, byte for byte, so the
# frames below carry their own boundaries:
#
#     frame = kind (1 byte) | length (4 bytes, big endian) | payload (length bytes, <= 65536)
#
#     0x01 data    both ways       terminal bytes: keystrokes in, shell output out
#     0x02 resize  to the server   columns u16 BE | rows u16 BE
#     0x03 exit    to the client   the shell's exit status, i32 BE; the server closes after it
#     0x04 hello   to the client   first frame: protocol version u8 (1)
#
# Every connection gets its own shell; shells keep running while their connection lasts. On
# SIGTERM the server hangs up every shell, removes its socket and its session directory, and
# exits. A malformed frame closes that connection (its shell is hung up), nothing else.

import asyncio
import fcntl
import os
import pty
import shutil
import signal
import struct
import sys
import termios
import time

DATA, RESIZE, EXIT, HELLO = 1, 2, 3, 4
VERSION = 1
MAX_PAYLOAD = 65536
HEADER = struct.Struct(">BI")


def frame(kind, payload=b""):
    return HEADER.pack(kind, len(payload)) + payload


class Shell:
    """One PTY shell and the connection it serves."""

    def __init__(self, server, reader, writer):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.pid = None
        self.fd = None
        self.pending = bytearray()
        self.writing = False
        self.closed = False

    def start(self):
        shell = os.environ.get("SHELL") or "/bin/bash"
        pid, fd = pty.fork()
        if pid == 0:
            try:
                os.execvp(shell, [shell, "-i"])
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        os.set_blocking(fd, False)
        self.server.note_shell(pid)
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, self.on_output)

    def on_output(self):
        try:
            data = os.read(self.fd, MAX_PAYLOAD)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.finish()
            return
        self.writer.write(frame(DATA, data))

    def write_input(self, data):
        self.pending += data
        self.flush_input()

    def flush_input(self):
        if self.fd is None:
            return
        while self.pending:
            try:
                n = os.write(self.fd, self.pending)
            except BlockingIOError:
                break
            except OSError:
                self.pending.clear()
                break
            del self.pending[:n]
        loop = asyncio.get_running_loop()
        if self.pending and not self.writing:
            loop.add_writer(self.fd, self.flush_input)
            self.writing = True
        elif not self.pending and self.writing:
            loop.remove_writer(self.fd)
            self.writing = False

    def resize(self, cols, rows):
        if self.fd is not None and cols > 0 and rows > 0:
            # The kernel signals SIGWINCH to the shell's foreground job.
            fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def finish(self):
        """The shell ended: send its status and close the connection."""
        if self.closed:
            return
        status = self.server.exit_status(self.pid)
        self.release()
        try:
            self.writer.write(frame(EXIT, struct.pack(">i", status)))
            self.writer.close()
        except Exception:
            pass

    def hang_up(self):
        """The connection ended (or the server stops): hang up the shell's session."""
        if self.closed:
            return
        if self.pid is not None:
            for sig in (signal.SIGHUP, signal.SIGCONT):
                try:
                    os.killpg(self.pid, sig)
                except OSError:
                    pass
        self.release()

    def release(self):
        self.closed = True
        if self.fd is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self.fd)
            if self.writing:
                loop.remove_writer(self.fd)
            os.close(self.fd)
            self.fd = None
        self.server.shells.discard(self)



class Server:
    def __init__(self, socket_path, session_dir):
        self.socket_path = socket_path
        self.session_dir = session_dir
        self.shells = set()
        self.statuses = {}

    def note_shell(self, pid):
        open(os.path.join(self.session_dir, "shells", str(pid)), "w").close()

    def forget_shell(self, pid):
        try:
            os.unlink(os.path.join(self.session_dir, "shells", str(pid)))
        except OSError:
            pass

    async def serve(self, reader, writer):
        shell = Shell(self, reader, writer)
        self.shells.add(shell)
        try:
            writer.write(frame(HELLO, bytes([VERSION])))
            shell.start()
            while not shell.closed:
                header = await reader.readexactly(HEADER.size)
                kind, length = HEADER.unpack(header)
                if length > MAX_PAYLOAD:
                    break
                payload = await reader.readexactly(length) if length else b""
                if kind == DATA:
                    shell.write_input(payload)
                elif kind == RESIZE and length == 4:
                    shell.resize(*struct.unpack(">HH", payload))
                else:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            shell.hang_up()
            try:
                writer.close()
            except Exception:
                pass

    def reap_all(self):
        """SIGCHLD: collect every exited shell, keeping the status of those still served."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.forget_shell(pid)
            if any(s.pid == pid and not s.closed for s in self.shells):
                self.statuses[pid] = os.waitstatus_to_exitcode(status)

    def exit_status(self, pid):
        """The exit status of a shell whose terminal closed (waiting briefly for it)."""
        if pid not in self.statuses:
            try:
                _, status = os.waitpid(pid, 0)
                self.forget_shell(pid)
                return os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                return self.statuses.pop(pid, -1)
        return self.statuses.pop(pid)

    def cleanup(self):
        sessions = {s.pid for s in self.shells if s.pid is not None}
        for shell in list(self.shells):
            shell.hang_up()
        # Whatever a shell left running in its session (a job that ignores SIGHUP) goes too.
        time.sleep(0.2 if sessions else 0)
        for pid in session_members(sessions):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for path in (self.socket_path,):
            try:
                os.unlink(path)
            except OSError:
                pass
        shutil.rmtree(self.session_dir, ignore_errors=True)


def session_members(sessions):
    """Pids of the live processes whose session is one of `sessions`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) in sessions:
            found.append(int(entry))
    return found


async def main(socket_path, session_dir):
    os.makedirs(os.path.join(session_dir, "shells"), mode=0o700, exist_ok=True)
    server = Server(socket_path, session_dir)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stopped.set)
    loop.add_signal_handler(signal.SIGCHLD, server.reap_all)
    old_umask = os.umask(0o077)
    listener = await asyncio.start_unix_server(server.serve, path=socket_path)
    os.umask(old_umask)
    try:
        await stopped.wait()
    finally:
        listener.close()
        server.cleanup()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write("usage: terminal_server.py <socket path> <session dir>\n")
        sys.exit(2)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
