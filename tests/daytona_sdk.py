"""Drives the daytona-emulator with Daytona's official Python SDK (`daytona` on PyPI).

Run by tests/daytona_sdk.rs with DAYTONA_API_URL pointing at the emulator and any
DAYTONA_API_KEY. Every step asserts a real outcome on a real machine; the script prints
`ok <step>` per step and exits non-zero at the first failure.
"""

import os
import sys
import time
import urllib.error
import urllib.request

from daytona import Daytona, DaytonaConfig, DaytonaError, DaytonaNotFoundError
from daytona.common.errors import DaytonaTimeoutError


def step(name):
    print(f"ok {name}", flush=True)


api_url = os.environ["DAYTONA_API_URL"]
daytona = Daytona(
    DaytonaConfig(api_key=os.environ["DAYTONA_API_KEY"], api_url=api_url, target="us")
)

sandbox = daytona.create(timeout=180)
assert sandbox.state == "started", sandbox.state
assert sandbox.id
step("create")

# A non-zero exit is an outcome; stdout and stderr come back together.
r = sandbox.process.exec("echo out; echo err >&2; exit 3")
assert r.exit_code == 3, r.exit_code
assert "out" in r.result and "err" in r.result, r.result
r = sandbox.process.exec("echo $GREETING from $(pwd)", env={"GREETING": "hello"})
assert r.exit_code == 0 and r.result.startswith("hello from /"), r.result
step("exec")

# A command past its timeout is killed: the SDK raises, and what it would have done later
# never happens.
started = time.monotonic()
try:
    sandbox.process.exec("sleep 4.31; touch /tmp/late-marker", timeout=1)
    raise AssertionError("a timed-out command returned")
except DaytonaTimeoutError:
    pass
assert time.monotonic() - started < 4, "the call waited for the command"
r = sandbox.process.exec("sleep 5; if [ -e /tmp/late-marker ]; then echo present; else echo absent; fi; pgrep -f 'sleep 4[.]31' || echo none", timeout=20)
assert "absent" in r.result and "none" in r.result, r.result
step("timeout kills")

payload = bytes(range(256)) * 40 + b"\x00end"
sandbox.fs.upload_file(payload, "docs/data.bin")
sandbox.fs.upload_file(b"hello file", "/tmp/abs.txt")
assert sandbox.fs.download_file("docs/data.bin") == payload
assert sandbox.fs.download_file("/tmp/abs.txt") == b"hello file"
r = sandbox.process.exec("cat docs/data.bin | wc -c")
assert r.result.strip() == str(len(payload)), r.result
files = {f.name: f for f in sandbox.fs.list_files("docs")}
assert "data.bin" in files and files["data.bin"].size == len(payload), files
assert not files["data.bin"].is_dir
try:
    sandbox.fs.download_file("docs/missing.bin")
    raise AssertionError("a missing file downloaded")
except DaytonaError:
    pass
step("files")

link = sandbox.get_preview_link(6080)
assert link.url.startswith("http://127.0.0.1:"), link.url
assert link.token, "a preview token"
assert sandbox.get_preview_link(6080).token == link.token, "one token per port"
try:
    urllib.request.urlopen(link.url + "/", timeout=10)
    raise AssertionError("a preview answered without its token")
except urllib.error.HTTPError as e:
    assert e.code == 401, e.code
step("preview link")

sandbox.stop(timeout=120)
assert sandbox.state == "stopped", sandbox.state
try:
    sandbox.process.exec("true")
    raise AssertionError("a stopped sandbox ran a command")
except DaytonaError:
    pass
step("stop")

sandbox.start(timeout=120)
assert sandbox.state == "started", sandbox.state
assert sandbox.fs.download_file("docs/data.bin") == payload, "files survive stop and start"
step("start")

sandbox_id = sandbox.id
sandbox.delete()
deadline = time.monotonic() + 60
while True:
    try:
        got = daytona.get(sandbox_id)
        if got.state == "destroyed":
            break
    except DaytonaNotFoundError:
        break
    assert time.monotonic() < deadline, "the sandbox was never deleted"
    time.sleep(0.5)
step("delete")
sys.exit(0)
