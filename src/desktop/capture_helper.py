# The in-computer screenshot helper for machines whose X server Rakazo cannot reach directly.
#
# Run as: DISPLAY=:N python3 capture_helper.py [settle FIRST_MS INTERVAL_MS TIMEOUT_MS]
# Prints "WIDTH HEIGHT" on the first line and the root window as a base64 PNG (RGB, 8 bits) on
# the second. With `settle`, it first waits FIRST_MS, then reads the screen every INTERVAL_MS
# until two reads in a row are the same or TIMEOUT_MS has passed, and prints the last read: the
# polling happens here, one command in all, not one command per look. Python's standard
# library and the machine's libX11 only (ctypes); exits 2 with a reason on stderr when the
# display cannot be read.
#
# As `capture_helper.py serve` it is an exec agent's helper: it keeps the display open and
# answers each line it reads ("grab", or "settle FIRST_MS INTERVAL_MS TIMEOUT_MS") with one
# line, "WIDTH HEIGHT BASE64", or "! REASON" for a frame it cannot print; it ends at the end of
# its input, or when the display goes. "input GROUP|GROUP|..." plays pointer input through
# XTEST, each group one action of space-separated steps ("m X Y" moves, "d B" presses and
# "u B" releases button B, "w MS" waits), and answers how many groups were done; "! REASON"
# when nothing was (no XTEST here).

import base64
import ctypes
import struct
import sys
import time
import zlib

ZPIXMAP = 2
ALL_PLANES = 0xFFFFFFFF
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

    def read(self):
        """The screen as BGRX rows without padding."""
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


def png_of(raw, width, height):
    # BGRX (least significant byte first) to RGB.
    rgb = bytearray(width * height * 3)
    rgb[0::3] = raw[2::4]
    rgb[1::3] = raw[1::4]
    rgb[2::3] = raw[0::4]
    row = width * 3
    scanlines = b"".join(b"\0" + rgb[r * row:(r + 1) * row] for r in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(scanlines, 6))
        + chunk(b"IEND", b"")
    )


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
            screen.x.XSync.argtypes = [ctypes.c_void_p, ctypes.c_int]
            screen.xtst = t
        except (OSError, AttributeError):
            screen.xtst = None
    return screen.xtst


def play(screen, groups):
    """Plays the groups' steps in order; how many groups were done."""
    t = xtest(screen)
    if t is None:
        return "! XTEST is not available"
    done = 0
    for group in groups.split("|"):
        words = group.split()
        try:
            steps = []
            i = 0
            while i < len(words):
                if words[i] == "m":
                    steps.append(("m", int(words[i + 1]), int(words[i + 2])))
                    i += 3
                elif words[i] in ("d", "u", "w"):
                    steps.append((words[i], int(words[i + 1])))
                    i += 2
                else:
                    raise ValueError(words[i])
        except (ValueError, IndexError):
            return str(done)
        for step in steps:
            if step[0] == "m":
                t.XTestFakeMotionEvent(screen.display, -1, step[1], step[2], 0)
            elif step[0] == "w":
                time.sleep(step[1] / 1000)
                continue
            else:
                t.XTestFakeButtonEvent(screen.display, step[1], step[0] == "d", 0)
            screen.x.XSync(screen.display, 0)
        done += 1
    return str(done)


def serve():
    # Like the agent: the bot (the same uid) cannot write answers into its pipes through /proc.
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass
    screen = Screen()
    for line in sys.stdin:
        words = line.split()
        raw = None
        if words[:1] == ["settle"]:
            try:
                first_ms, interval_ms, timeout_ms = (int(a) for a in words[1:4])
                raw = settled(screen, first_ms, interval_ms, timeout_ms)
            except ValueError:
                sys.stdout.write("! usage: settle FIRST_MS INTERVAL_MS TIMEOUT_MS\n")
        elif words == ["grab"]:
            raw = screen.read()
        elif words[:1] == ["input"]:
            sys.stdout.write(play(screen, line.strip()[len("input"):].strip()) + "\n")
        else:
            sys.stdout.write("! unknown request\n")
        if raw is not None:
            encoded = base64.b64encode(png_of(raw, screen.width, screen.height))
            if len(encoded) > MAX_OUTPUT:
                sys.stdout.write("! the frame is too large for the command path\n")
            else:
                sys.stdout.write(f"{screen.width} {screen.height} {encoded.decode()}\n")
        sys.stdout.flush()


def main():
    if sys.argv[1:2] == ["serve"]:
        serve()
        return
    screen = Screen()
    if sys.argv[1:2] == ["settle"]:
        try:
            first_ms, interval_ms, timeout_ms = (int(a) for a in sys.argv[2:5])
        except ValueError:
            fail("usage: settle FIRST_MS INTERVAL_MS TIMEOUT_MS")
        raw = settled(screen, first_ms, interval_ms, timeout_ms)
    else:
        raw = screen.read()
    encoded = base64.b64encode(png_of(raw, screen.width, screen.height))
    if len(encoded) > MAX_OUTPUT:
        fail("the frame is too large for the command path")
    sys.stdout.write(f"{screen.width} {screen.height}\n")
    sys.stdout.write(encoded.decode())
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
