"""Starts headless Chromium as the computer's user (no --no-sandbox), waits for a renderer,
prints every Chromium process with its type, user and PID namespaces and seccomp filter
count as JSON, then ends the browser. Run inside a computer by tests/seccomp_allowlist.rs."""
import json, os, re, signal, subprocess, time

browser = subprocess.Popen(
    ["chromium", "--headless=new", "--no-first-run", "--user-data-dir=/tmp/probe-profile", "about:blank"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def procs():
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            status = open(f"/proc/{pid}/status").read()
            ns = {n: os.readlink(f"/proc/{pid}/ns/{n}") for n in ("user", "pid", "net")}
        except OSError:
            continue
        args = [a for a in re.split(r"[\0 ]", raw) if a]
        if not args or "chromium" not in args[0]:
            continue
        fields = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
        out.append({
            "pid": int(pid),
            "type": next((a.split("=", 1)[1] for a in args if a.startswith("--type=")), "browser"),
            "seccompFilters": int(fields.get("Seccomp_filters", "0").strip()),
            "ns": ns,
            "noSandbox": "--no-sandbox" in args,
        })
    return out


try:
    for _ in range(150):
        found = procs()
        if any(p["type"] == "renderer" for p in found) and any(p["type"] == "browser" for p in found):
            break
        time.sleep(0.2)
    print(json.dumps(procs()))
finally:
    os.killpg(browser.pid, signal.SIGKILL)
