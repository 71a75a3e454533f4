"""Waits up to WAIT seconds for a spawned process of the vendor emulators to print or end,
then prints `<exit or -> <alive 0/1>`, its new stdout and its new stderr (base64, one line
each, at most CAP bytes together, stderr first up to a quarter of them). Looks every 5 ms
without starting a process.

Usage: poll_process.py DIR PID OUT_OFFSET ERR_OFFSET WAIT CAP"""

import base64
import os
import sys
import time


def main():
    d, pid = sys.argv[1], int(sys.argv[2])
    out_off, err_off = int(sys.argv[3]), int(sys.argv[4])
    wait, cap = float(sys.argv[5]), int(sys.argv[6])

    def size(name):
        try:
            return os.stat(os.path.join(d, name)).st_size
        except OSError:
            return 0

    def alive():
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def exited():
        try:
            with open(os.path.join(d, "exit")) as f:
                return f.read().strip() or "-"
        except OSError:
            return "-"

    def tail(name, offset, limit):
        try:
            with open(os.path.join(d, name), "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except OSError:
            return b""

    until = time.monotonic() + wait
    while (
        not os.path.exists(os.path.join(d, "exit"))
        and alive()
        and size("out") <= out_off
        and size("err") <= err_off
        and time.monotonic() < until
    ):
        time.sleep(0.005)
    ex = exited()
    running = 1 if ex == "-" and alive() else 0
    err = tail("err", err_off, cap // 4)
    out = tail("out", out_off, cap - len(err))
    b64 = lambda data: base64.b64encode(data).decode()
    sys.stdout.write(f"{ex} {running}\n{b64(out)}\n{b64(err)}\n")


main()
