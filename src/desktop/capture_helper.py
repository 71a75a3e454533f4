# The in-computer screenshot helper for machines whose X server Rakazo cannot reach directly.
#
# Run as: DISPLAY=:N python3 capture_helper.py [settle FIRST_MS INTERVAL_MS TIMEOUT_MS [REACT_MS
# QUIET_MS]]. Prints "WIDTH HEIGHT" on the first line and the root window as a base64 PNG (RGB,
# 8 bits) on the second. With `settle`, it waits for the screen to settle first, inside the
# machine: one command in all, not one command per look. Where the X server reports drawing
# (the DAMAGE extension) and REACT_MS and QUIET_MS are given, the screen is settled once nothing
# was drawn for QUIET_MS, but no sooner than REACT_MS after the start; otherwise it waits
# FIRST_MS, then reads the screen every INTERVAL_MS until two reads in a row are the same. Either
# way it gives up waiting after TIMEOUT_MS and prints the last read. Python's standard library
# and the machine's libX11 (ctypes; libXdamage and libXtst where present); exits 2 with a reason
# on stderr when the display cannot be read.
#
# As `capture_helper.py serve` it is an exec agent's helper: it keeps the display open and
# answers each line it reads ("grab", or "settle" and its times as above) with one line, "SEQ
# WIDTH HEIGHT BASE64" (SEQ numbers the frame), or "! REASON" for a frame it cannot print; it
# ends at the end of its input, or when the display goes. A screen nothing was drawn on since
# the last frame is answered with that frame again, without reading or encoding it, and as "SEQ
# WIDTH HEIGHT =" to a request that begins "have SEQ " with its number: the caller has it. "act
# FIRST_MS INTERVAL_MS TIMEOUT_MS REACT_MS QUIET_MS ; GROUP|GROUP|..." plays pointer and key
# input through XTEST, each group one action of space-separated steps ("m X Y" moves, "d B" presses
# and "u B" releases button B, "w MS" waits; "p K" presses and "r K" releases the key of keysym
# K, "t K" taps it, with Shift where the keysym needs it; a keysym missing from the keyboard map
# is bound to a spare keycode first, as the direct path and `xdotool type` do), then settles the
# screen as "settle" would, and
# answers how many groups were done and the frame, "DONE SEQ WIDTH HEIGHT BASE64": a batch and
# its frame are one round trip, where each line crosses a network. It answers "! REASON" when
# nothing was played (no XTEST here). "script DEADLINE_MS FIRST_MS INTERVAL_MS TIMEOUT_MS
# REACT_MS QUIET_MS ; BASE64" runs the script (a batch of `xdotool` calls) with bash, killed at
# the deadline, then settles, and answers "CODE OUT ERR SEQ WIDTH HEIGHT BASE64" (the script's
# exit code and its streams in base64, "." when empty): where the X server has no XTEST, a
# batch and its frame are one round trip too. "reads" answers how many times the screen was read. Rows
# whose pixels did not change since its last frame keep their deflated bytes (see Encoder).

import base64
import ctypes
import os
import select
import struct
import subprocess
import sys
import time
import zlib

ZPIXMAP = 2
ALL_PLANES = 0xFFFFFFFF
# XDamageReportNonEmpty: one report when a drawn-on screen was clean, re-armed by a subtract.
DAMAGE_REPORT_NON_EMPTY = 3
# sizeof(XEvent): a union of 24 longs.
XEVENT_BYTES = 24 * ctypes.sizeof(ctypes.c_long)
# Largest base64 frame printed: the command path caps what one command may print.
MAX_OUTPUT = 1_000_000


class XImage(ctypes.Structure):
    _fields_ = [
        ("width", ctypes.c_int),
        ("height", ctypes.c_int),
        ("xoffset", ctypes.c_int),
        ("format", ctypes.c_int),
        ("data", ctypes.c_void_p),
        ("byte_order", ctypes.c_int),
        ("bitmap_unit", ctypes.c_int),
        ("bitmap_bit_order", ctypes.c_int),
        ("bitmap_pad", ctypes.c_int),
        ("depth", ctypes.c_int),
        ("bytes_per_line", ctypes.c_int),
        ("bits_per_pixel", ctypes.c_int),
    ]


def fail(reason):
    sys.stderr.write(reason + "\n")
    sys.exit(2)


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


class Screen:
    def __init__(self):
        try:
            x = ctypes.CDLL("libX11.so.6")
        except OSError:
            fail("libX11 is not installed")
        x.XOpenDisplay.restype = ctypes.c_void_p
        x.XOpenDisplay.argtypes = [ctypes.c_char_p]
        x.XDefaultRootWindow.restype = ctypes.c_ulong
        x.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
        x.XDisplayWidth.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x.XDisplayHeight.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x.XGetImage.restype = ctypes.POINTER(XImage)
        x.XGetImage.argtypes = [
            ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_int,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_ulong, ctypes.c_int,
        ]
        x.XFree.argtypes = [ctypes.c_void_p]
        self.x = x
        self.display = x.XOpenDisplay(None)
        if not self.display:
            fail("cannot open the display")
        self.width = x.XDisplayWidth(self.display, 0)
        self.height = x.XDisplayHeight(self.display, 0)
        self.root = x.XDefaultRootWindow(self.display)
        x.XSync.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.reads = 0

    def read(self):
        """The screen as BGRX rows without padding."""
        self.reads += 1
        width, height = self.width, self.height
        image = self.x.XGetImage(self.display, self.root, 0, 0, width, height, ALL_PLANES, ZPIXMAP)
        if not image:
            fail("cannot read the root window")
        im = image.contents
        if im.bits_per_pixel != 32 or im.byte_order != 0:
            fail("unsupported pixel format")
        stride = im.bytes_per_line
        raw = ctypes.string_at(im.data, stride * height)
        # A ZPixmap image from XGetImage is its struct and one data block, both Xlib's.
        self.x.XFree(im.data)
        self.x.XFree(image)
        if stride != width * 4:
            raw = b"".join(raw[r * stride:r * stride + width * 4] for r in range(height))
        return raw


# Rows per band: a band whose pixels did not change since the last frame keeps its encoding.
BAND_ROWS = 16
DEFLATE_LEVEL = 6


def scanlines(raw, width, rows):
    """BGRX rows (least significant byte first) as PNG scanlines: filter byte 0, then RGB."""
    rgb = bytearray(width * rows * 3)
    rgb[0::3] = raw[2::4]
    rgb[1::3] = raw[1::4]
    rgb[2::3] = raw[0::4]
    row = width * 3
    return b"".join(b"\0" + rgb[r * row:(r + 1) * row] for r in range(rows))


class Encoder:
    """PNG frames of one screen. The image data is deflated by bands of rows, each ended on a
    byte boundary (a full flush) and each primed with the band before it (a preset
    dictionary: its matches may reach back into that band, as in one stream), so a band whose
    pixels, and the pixels of the band before it, are the same as in the last frame reuses its
    deflated bytes: only what changed is converted and deflated again."""

    def __init__(self):
        self.bands = []

    def png(self, raw, width, height):
        stride = width * 4
        bands = []
        adler = 1
        changed = False
        for i, top in enumerate(range(0, height, BAND_ROWS)):
            rows = min(BAND_ROWS, height - top)
            pixels = raw[top * stride:(top + rows) * stride]
            old = self.bands[i] if i < len(self.bands) else None
            same = old is not None and old[0] == pixels
            if changed or not same:
                scan = scanlines(pixels, width, rows)
                if bands:
                    deflate = zlib.compressobj(
                        DEFLATE_LEVEL, zlib.DEFLATED, -15, zdict=bands[-1][1][-32768:]
                    )
                else:
                    deflate = zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -15)
                band = (pixels, scan, deflate.compress(scan) + deflate.flush(zlib.Z_FULL_FLUSH))
            else:
                band = old
            adler = zlib.adler32(band[1], adler)
            bands.append(band)
            # The next band is primed with this one: encoded again when this one's pixels changed.
            changed = not same
        self.bands = bands
        # A zlib stream: its header, the bands, an empty final block, the checksum.
        data = b"\x78\x01" + b"".join(b[2] for b in bands) + b"\x03\x00" + struct.pack(">I", adler)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", data)
            + chunk(b"IEND", b"")
        )


def png_of(raw, width, height):
    """One frame as PNG (RGB, 8 bits)."""
    return Encoder().png(raw, width, height)


class Damage:
    """The X server's reports of drawing on the root window (the DAMAGE extension)."""

    def __init__(self, screen):
        lib = ctypes.CDLL("libXdamage.so.1")
        lib.XDamageQueryExtension.argtypes = [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
        ]
        lib.XDamageQueryVersion.argtypes = lib.XDamageQueryExtension.argtypes
        lib.XDamageCreate.restype = ctypes.c_ulong
        lib.XDamageCreate.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int]
        lib.XDamageSubtract.argtypes = [
            ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
        ]
        event_base, error_base = ctypes.c_int(), ctypes.c_int()
        if not lib.XDamageQueryExtension(
            screen.display, ctypes.byref(event_base), ctypes.byref(error_base)
        ):
            raise OSError("the X server has no DAMAGE extension")
        major, minor = ctypes.c_int(1), ctypes.c_int(1)
        if not lib.XDamageQueryVersion(screen.display, ctypes.byref(major), ctypes.byref(minor)):
            raise OSError("the DAMAGE extension did not answer")
        x = screen.x
        x.XPending.argtypes = [ctypes.c_void_p]
        x.XNextEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        x.XConnectionNumber.argtypes = [ctypes.c_void_p]
        x.XFlush.argtypes = [ctypes.c_void_p]
        self.lib, self.screen = lib, screen
        self.notify = event_base.value  # + XDamageNotify, which is 0
        self.fd = x.XConnectionNumber(screen.display)
        self.event = ctypes.create_string_buffer(XEVENT_BYTES)
        self.damage = lib.XDamageCreate(screen.display, screen.root, DAMAGE_REPORT_NON_EMPTY)
        # Drawn on since the last frame (a new helper has no last frame).
        self.dirty = True
        x.XSync(screen.display, 0)

    def take(self):
        """Whether drawing was reported since the last look; re-arms the reports."""
        x, display = self.screen.x, self.screen.display
        seen = False
        while x.XPending(display):
            x.XNextEvent(display, self.event)
            if struct.unpack_from("i", self.event.raw)[0] == self.notify:
                seen = True
        if seen:
            self.dirty = True
            self.lib.XDamageSubtract(display, self.damage, 0, 0)
            x.XFlush(display)
        return seen

    def sync(self):
        """After a round trip every report of drawing done before it has arrived."""
        self.screen.x.XSync(self.screen.display, 0)
        return self.take()

    def quiet(self, react_ms, quiet_ms, timeout_ms):
        """Waits until nothing was drawn for `quiet_ms`, but at least `react_ms` (time for an
        application to answer input), at most `timeout_ms`."""
        start = time.monotonic()
        self.sync()
        last_drawn = start
        while True:
            if self.take():
                last_drawn = time.monotonic()
            now = time.monotonic()
            ready = max(start + react_ms / 1000, last_drawn + quiet_ms / 1000)
            end = min(ready, start + timeout_ms / 1000)
            if now >= end:
                return
            # Woken by the next report, or when the wait is over.
            select.select([self.fd], [], [], end - now)


def damage_of(screen):
    """The screen's damage reports, or None where the X server or the machine has none."""
    try:
        return Damage(screen)
    except (OSError, AttributeError):
        return None


def settled(screen, first_ms, interval_ms, timeout_ms):
    deadline = time.monotonic() + timeout_ms / 1000
    time.sleep(first_ms / 1000)
    last = screen.read()
    while time.monotonic() < deadline:
        time.sleep(interval_ms / 1000)
        current = screen.read()
        if current == last:
            break
        last = current
    return last


def xtest(screen):
    """libXtst's fake input, or None where it is missing."""
    if not hasattr(screen, "xtst"):
        try:
            t = ctypes.CDLL("libXtst.so.6")
            t.XTestFakeMotionEvent.argtypes = [
                ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_ulong,
            ]
            t.XTestFakeButtonEvent.argtypes = [
                ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_ulong,
            ]
            t.XTestFakeKeyEvent.argtypes = [
                ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_ulong,
            ]
            screen.xtst = t
        except (OSError, AttributeError):
            screen.xtst = None
    return screen.xtst


def run_script(encoded, timeout_s):
    """Runs the base64 `encoded` script with bash (stdin empty, its own session, killed at
    the deadline): "CODE OUT ERR", each stream base64 ("." when empty, at most 64 KiB)."""
    try:
        script = base64.b64decode(encoded, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return "! unreadable script"
    try:
        done = subprocess.run(
            ["bash", "-c", script],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            start_new_session=True,
        )
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = -1, e.stdout or b"", (e.stderr or b"") + b"\nthe batch's deadline passed"
    except OSError as e:
        return f"! the batch cannot start: {e.strerror}"
    words = [base64.b64encode(data[:65536]).decode() or "." for data in (out, err)]
    return f"{code} {words[0]} {words[1]}"


# Keysym of the left Shift key.
SHIFT_L = 0xFFE1
# Key steps played between two waits for the server.
KEY_STEPS_PER_SYNC = 64


class Keymap:
    """The server's keyboard map: the keycode of a keysym and whether Shift is needed (the
    first keycode with it unshifted, else the first with it shifted); a keysym it lacks is bound
    to a keycode bound to nothing (round robin)."""

    def __init__(self, screen):
        x, display = screen.x, screen.display
        x.XDisplayKeycodes.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        x.XGetKeyboardMapping.restype = ctypes.POINTER(ctypes.c_ulong)
        x.XGetKeyboardMapping.argtypes = [
            ctypes.c_void_p, ctypes.c_ubyte, ctypes.c_int, ctypes.c_void_p,
        ]
        x.XChangeKeyboardMapping.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
        ]
        low, high, per = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        x.XDisplayKeycodes(display, ctypes.byref(low), ctypes.byref(high))
        count = high.value - low.value + 1
        mapping = x.XGetKeyboardMapping(display, low.value, count, ctypes.byref(per))
        self.screen, self.per = screen, max(per.value, 1)
        syms = [mapping[i] for i in range(count * self.per)] if mapping else []
        if mapping:
            x.XFree(mapping)
        rows = [syms[i:i + self.per] for i in range(0, len(syms), self.per)]
        self.codes = {}
        for level in range(min(2, self.per)):
            for i, row in enumerate(rows):
                if row[level]:
                    self.codes.setdefault(row[level], (low.value + i, level == 1))
        self.spare = [low.value + i for i, row in enumerate(rows) if not any(row)]
        self.next_spare = 0

    def code(self, keysym):
        """(keycode, Shift needed), binding a spare keycode when the map lacks `keysym`."""
        found = self.codes.get(keysym)
        if found:
            return found
        if not self.spare:
            raise ValueError("no spare keycode")
        code = self.spare[self.next_spare % len(self.spare)]
        self.next_spare += 1
        for old in [sym for sym, (c, _) in self.codes.items() if c == code]:
            del self.codes[old]
        self.codes[keysym] = (code, False)
        row = [keysym if i < 2 else 0 for i in range(self.per)]
        x, display = self.screen.x, self.screen.display
        x.XChangeKeyboardMapping(display, code, self.per, (ctypes.c_ulong * self.per)(*row), 1)
        x.XSync(display, 0)
        # Clients reload their map on MappingNotify; give them a moment before the key arrives.
        time.sleep(0.02)
        return code, False


def parse_steps(group):
    """The steps of one group: (kind, numbers...)."""
    words, steps, i = group.split(), [], 0
    while i < len(words):
        if words[i] == "m":
            steps.append(("m", int(words[i + 1]), int(words[i + 2])))
            i += 3
        elif words[i] in ("d", "u", "w", "p", "r", "t"):
            steps.append((words[i], int(words[i + 1])))
            i += 2
        else:
            raise ValueError(words[i])
    return steps


def play(screen, groups):
    """Plays the groups' steps in order; how many groups were done."""
    t = xtest(screen)
    if t is None:
        return "! XTEST is not available"
    display = screen.display
    done = 0
    for group in groups.split("|"):
        try:
            steps = parse_steps(group)
        except (ValueError, IndexError):
            return str(done)
        keys = 0
        try:
            for step in steps:
                kind = step[0]
                if kind == "m":
                    t.XTestFakeMotionEvent(display, -1, step[1], step[2], 0)
                elif kind == "w":
                    screen.x.XSync(display, 0)
                    time.sleep(step[1] / 1000)
                    continue
                elif kind in ("d", "u"):
                    t.XTestFakeButtonEvent(display, step[1], kind == "d", 0)
                else:
                    if not hasattr(screen, "keymap"):
                        screen.keymap = Keymap(screen)
                    code, shift = screen.keymap.code(step[1])
                    if kind == "t":
                        shift_code = screen.keymap.code(SHIFT_L)[0] if shift else None
                        if shift_code:
                            t.XTestFakeKeyEvent(display, shift_code, True, 0)
                        t.XTestFakeKeyEvent(display, code, True, 0)
                        t.XTestFakeKeyEvent(display, code, False, 0)
                        if shift_code:
                            t.XTestFakeKeyEvent(display, shift_code, False, 0)
                    else:
                        t.XTestFakeKeyEvent(display, code, kind == "p", 0)
                    keys += 1
                    if keys % KEY_STEPS_PER_SYNC:
                        continue
                screen.x.XSync(display, 0)
        except ValueError:
            screen.x.XSync(display, 0)
            return str(done)
        screen.x.XSync(display, 0)
        done += 1
    return str(done)


SETTLE_USAGE = "usage: settle FIRST_MS INTERVAL_MS TIMEOUT_MS [REACT_MS QUIET_MS]"


def settle_times(words):
    """The times of a settle request: (first, interval, timeout, react and quiet or None)."""
    times = [int(a) for a in words]
    if len(times) not in (3, 5) or min(times) < 0:
        raise ValueError(SETTLE_USAGE)
    return times[0], times[1], times[2], (times[3:5] if len(times) == 5 else None)


def settle_read(screen, damage, words):
    """The screen read once it settled as `words` ask (see the top of this file)."""
    first_ms, interval_ms, timeout_ms, by_damage = settle_times(words)
    if damage is not None and by_damage is not None:
        damage.quiet(by_damage[0], by_damage[1], timeout_ms)
        return None
    return settled(screen, first_ms, interval_ms, timeout_ms)


class Frames:
    """A kept display's frames: the last one is answered again while nothing is drawn, and
    not even sent again to a caller that has it. Frames are numbered from a random start, so
    a number never names a frame of another helper."""

    def __init__(self, screen):
        self.screen = screen
        self.damage = damage_of(screen)
        self.kept = None
        self.seq = int.from_bytes(os.urandom(6), "big")
        self.encoder = Encoder()

    def line(self, raw=None, have=None):
        """The answer line of the screen as it is now (`raw`: a read just made by polling):
        "SEQ WIDTH HEIGHT BASE64", or "SEQ WIDTH HEIGHT =" when it is frame `have` again."""
        screen, damage = self.screen, self.damage
        keep = False
        if raw is None:
            if damage is not None:
                damage.sync()
                if not damage.dirty and self.kept is not None:
                    if have == self.seq:
                        return f"{self.seq} {screen.width} {screen.height} ="
                    return f"{self.seq} {self.kept}"
                # Reports from here on belong to the frame after this one.
                damage.dirty = False
                keep = True
            raw = screen.read()
        encoded = base64.b64encode(self.encoder.png(raw, screen.width, screen.height))
        self.kept = None
        self.seq += 1
        if len(encoded) > MAX_OUTPUT:
            return "! the frame is too large for the command path"
        line = f"{screen.width} {screen.height} {encoded.decode()}"
        if keep:
            self.kept = line
        return f"{self.seq} {line}"


def serve():
    # Like the agent: the bot (the same uid) cannot write answers into its pipes through /proc.
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass
    screen = Screen()
    frames = Frames(screen)
    for line in sys.stdin:
        line = line.strip()
        have = None
        if line.startswith("have "):
            _, number, line = (line.split(None, 2) + ["", ""])[:3]
            have = int(number) if number.isdigit() else None
        words = line.split()
        if words[:1] == ["settle"]:
            try:
                raw = settle_read(screen, frames.damage, words[1:])
                answer = frames.line(raw, have)
            except ValueError:
                answer = "! " + SETTLE_USAGE
        elif words == ["grab"]:
            answer = frames.line(None, have)
        elif words[:1] == ["act"]:
            times, _, groups = line[len("act"):].partition(";")
            answer = play(screen, groups.strip())
            if not answer.startswith("!"):
                try:
                    raw = settle_read(screen, frames.damage, times.split())
                    answer += " " + frames.line(raw, have)
                except ValueError:
                    answer = "! " + SETTLE_USAGE
        elif words[:1] == ["script"]:
            times, _, encoded = line[len("script"):].partition(";")
            words = times.split()
            try:
                deadline = int(words[0]) / 1000
            except (ValueError, IndexError):
                deadline = None
            if deadline is None:
                answer = "! usage: script DEADLINE_MS " + SETTLE_USAGE[len("usage: settle "):] + " ; BASE64"
            else:
                answer = run_script(encoded.strip(), deadline)
                if not answer.startswith("!"):
                    try:
                        raw = settle_read(screen, frames.damage, words[1:])
                        answer += " " + frames.line(raw, have)
                    except ValueError:
                        answer = "! " + SETTLE_USAGE
        elif words == ["reads"]:
            answer = str(screen.reads)
        else:
            answer = "! unknown request"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


def main():
    if sys.argv[1:2] == ["serve"]:
        serve()
        return
    screen = Screen()
    raw = None
    if sys.argv[1:2] == ["settle"]:
        try:
            times = settle_times(sys.argv[2:])
        except ValueError:
            fail(SETTLE_USAGE)
        damage = damage_of(screen) if times[3] is not None else None
        raw = settle_read(screen, damage, sys.argv[2:])
    if raw is None:
        raw = screen.read()
    encoded = base64.b64encode(png_of(raw, screen.width, screen.height))
    if len(encoded) > MAX_OUTPUT:
        fail("the frame is too large for the command path")
    sys.stdout.write(f"{screen.width} {screen.height}\n")
    sys.stdout.write(encoded.decode())
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
