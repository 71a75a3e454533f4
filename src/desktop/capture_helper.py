# The in-computer screenshot helper for machines whose X server Rakazo cannot reach directly.
#
# Run as: DISPLAY=:N python3 capture_helper.py
# Prints "WIDTH HEIGHT" on the first line and the root window as a base64 PNG (RGB, 8 bits) on
# the second. Python's standard library and the machine's libX11 only (ctypes); exits 2 with a
# reason on stderr when the display cannot be read.

import base64
import ctypes
import struct
import sys
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


def main():
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
    display = x.XOpenDisplay(None)
    if not display:
        fail("cannot open the display")
    width, height = x.XDisplayWidth(display, 0), x.XDisplayHeight(display, 0)
    image = x.XGetImage(display, x.XDefaultRootWindow(display), 0, 0, width, height, ALL_PLANES, ZPIXMAP)
    if not image:
        fail("cannot read the root window")
    im = image.contents
    if im.bits_per_pixel != 32 or im.byte_order != 0:
        fail("unsupported pixel format")
    stride = im.bytes_per_line
    raw = ctypes.string_at(im.data, stride * height)
    if stride != width * 4:
        raw = b"".join(raw[r * stride:r * stride + width * 4] for r in range(height))
    # BGRX (least significant byte first) to RGB.
    rgb = bytearray(width * height * 3)
    rgb[0::3] = raw[2::4]
    rgb[1::3] = raw[1::4]
    rgb[2::3] = raw[0::4]
    row = width * 3
    scanlines = b"".join(b"\0" + rgb[r * row:(r + 1) * row] for r in range(height))
    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(scanlines, 6))
        + chunk(b"IEND", b"")
    )
    encoded = base64.b64encode(png)
    if len(encoded) > MAX_OUTPUT:
        fail("the frame is too large for the command path")
    sys.stdout.write(f"{width} {height}\n")
    sys.stdout.write(encoded.decode())
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
