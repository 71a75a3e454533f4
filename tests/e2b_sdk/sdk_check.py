"""Drives the e2b-emulator with E2B's official Python SDK (`e2b` on PyPI), asserting real
outcomes; run by tests/e2b_emulator_sdk.rs with E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN and
E2B_API_KEY pointing at the emulator. Prints one line per check and `ALL OK` at the end."""

import sys
import time

from e2b import Sandbox
from e2b.exceptions import NotFoundException, SandboxException
from e2b.sandbox.commands.command_handle import CommandExitException


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok {name}", flush=True)


sbx = Sandbox.create(template="base", timeout=120, metadata={"purpose": "sdk-check"})
check("create gives an id", len(sbx.sandbox_id) == 20, sbx.sandbox_id)
try:
    info = sbx.get_info()
    check("info says running", info.state.value == "running", info.state)
    check("info keeps metadata", info.metadata.get("purpose") == "sdk-check", info.metadata)

    r = sbx.commands.run("echo hello; echo oops >&2; whoami; pwd")
    check("run output", r.stdout.split() == ["hello", "user", "/home/user"], repr(r.stdout))
    check("run stderr", r.stderr.strip() == "oops", repr(r.stderr))
    check("run exit code", r.exit_code == 0, r.exit_code)

    try:
        sbx.commands.run("echo partial; exit 3")
        check("failure raises", False, "no exception")
    except CommandExitException as e:
        check("failure exit code", e.exit_code == 3, e.exit_code)
        check("failure output", e.stdout.strip() == "partial", repr(e.stdout))

    r = sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.3; done")
    check("streamed output", r.stdout.split() == ["line1", "line2", "line3"], repr(r.stdout))

    seen = []
    r = sbx.commands.run("echo one; sleep 0.5; echo two", on_stdout=lambda s: seen.append(s))
    check("stdout callback", "".join(seen).split() == ["one", "two"], seen)

    bg = sbx.commands.run("sleep 30; echo never", background=True)
    check("background pid", bg.pid > 0, bg.pid)
    listed = [p.pid for p in sbx.commands.list()]
    check("background listed", bg.pid in listed, listed)
    check("kill background", sbx.commands.kill(bg.pid) is True)
    time.sleep(0.5)
    listed = [p.pid for p in sbx.commands.list()]
    check("killed is gone", bg.pid not in listed, listed)
    check("kill unknown pid", sbx.commands.kill(999999) is False)

    # stdin kept open: lines sent one at a time are read as they come, and closing it ends
    # the reader; a command started without it refuses input.
    reader = sbx.commands.run(
        "while read -r l; do echo \"got:$l\"; done; echo closed", background=True, stdin=True
    )
    sbx.commands.send_stdin(reader.pid, "one\n")
    sbx.commands.send_stdin(reader.pid, b"two\n")
    sbx.commands.close_stdin(reader.pid)
    r = reader.wait()
    check("stdin lines", r.stdout.split() == ["got:one", "got:two", "closed"], repr(r.stdout))
    plain = sbx.commands.run("sleep 30", background=True)
    try:
        sbx.commands.send_stdin(plain.pid, "lost\n")
        check("input without stdin refused", False, "no exception")
    except SandboxException as e:
        check("input without stdin refused", "stdin not enabled" in str(e), str(e))
    sbx.commands.kill(plain.pid)
    try:
        sbx.commands.send_stdin(999999, "nobody\n")
        check("input to unknown pid", False, "no exception")
    except NotFoundException:
        check("input to unknown pid", True)

    bg2 = sbx.commands.run("sleep 1; echo survived > /home/user/bg.txt", background=True)
    bg2.disconnect()
    time.sleep(2.5)
    check("disconnected keeps running", sbx.files.read("bg.txt").strip() == "survived")

    sbx.files.write("/home/user/notes/hello.txt", "hi there\n")
    check("read text", sbx.files.read("/home/user/notes/hello.txt") == "hi there\n")
    blob = bytes(range(256)) * 4000
    sbx.files.write("notes/blob.bin", blob)
    check("read bytes", bytes(sbx.files.read("notes/blob.bin", format="bytes")) == blob)
    r = sbx.commands.run("sha256sum /home/user/notes/blob.bin | cut -c1-16")
    import hashlib
    check("bytes on the machine", r.stdout.strip() == hashlib.sha256(blob).hexdigest()[:16], r.stdout)
    entries = {e.name: e for e in sbx.files.list("/home/user/notes")}
    check("list names", set(entries) == {"hello.txt", "blob.bin"}, entries.keys())
    check("list size", entries["blob.bin"].size == len(blob), entries["blob.bin"].size)
    check("list type", entries["hello.txt"].type.value == "file", entries["hello.txt"].type)
    check("exists", sbx.files.exists("notes/hello.txt") and not sbx.files.exists("notes/nope"))
    check("make_dir", sbx.files.make_dir("notes/sub") is True and sbx.files.make_dir("notes/sub") is False)
    sbx.files.rename("notes/hello.txt", "notes/sub/moved.txt")
    check("rename", sbx.files.read("notes/sub/moved.txt") == "hi there\n")
    sbx.files.remove("notes/sub/moved.txt")
    check("remove", not sbx.files.exists("notes/sub/moved.txt"))
    try:
        sbx.files.read("/home/user/does-not-exist")
        check("missing file raises", False)
    except NotFoundException:
        check("missing file raises", True)

    sbx.set_timeout(60)
    end = sbx.get_info().end_at.timestamp()
    check("set_timeout moves the end", abs(end - (time.time() + 60)) < 15, end - time.time())

    same = Sandbox.connect(sbx.sandbox_id)
    r = same.commands.run("cat /home/user/notes/blob.bin | wc -c")
    check("connect and run", r.stdout.strip() == str(len(blob)), r.stdout)
    listed = [s.sandbox_id for s in Sandbox.list().next_items()]
    check("list sandboxes", sbx.sandbox_id in listed, listed)
finally:
    killed = sbx.kill()
check("kill", killed is True)
check("kill again", Sandbox.kill(sbx.sandbox_id) is False)
try:
    Sandbox.connect(sbx.sandbox_id)
    check("connect to killed raises", False)
except (NotFoundException, SandboxException) as e:
    check("connect to killed raises", "not found" in str(e).lower(), str(e))

print("ALL OK", flush=True)
