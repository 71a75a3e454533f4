# Benchmark of the command path's capture helper encoder (src/desktop/capture_helper.py): a
# 1280x800 screen of text-like rows with some noisy bands, encoded whole by the helper's band
# encoder beside the baseline of one zlib stream over the same scanlines (what the helper did
# before), then the band encoder again after a 20x20 spot changed. Prints best-of-N times in
# ms and the PNG data sizes. Run: python3 scripts/bench-capture-helper.py [ROUNDS]
import os
import random
import struct
import sys
import time
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src", "desktop"))
import capture_helper as helper  # noqa: E402

WIDTH, HEIGHT = 1280, 800


def screen():
    rng = random.Random(7)
    white = b"\xff" * (WIDTH * 4)
    noise = bytes(rng.getrandbits(8) for _ in range(WIDTH * 4))
    text = bytearray(white)
    for x in range(0, WIDTH * 4, 4 * 7):
        text[x:x + 3] = b"\x20\x30\x40"
    text = bytes(text)
    rows = (noise if (r // 10) % 9 == 0 else text if (r // 3) % 4 == 0 else white for r in range(HEIGHT))
    return b"".join(rows)


def spotted(raw):
    out = bytearray(raw)
    for r in range(400, 420):
        out[r * WIDTH * 4 + 400 * 4:r * WIDTH * 4 + 420 * 4] = b"\x00" * 80
    return bytes(out)


def best(rounds, f):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    raw, changed = screen(), spotted(screen())

    def baseline():
        data = zlib.compress(helper.scanlines(raw, WIDTH, HEIGHT), helper.DEFLATE_LEVEL)
        header = struct.pack(">IIBBBBB", WIDTH, HEIGHT, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + helper.chunk(b"IHDR", header)
            + helper.chunk(b"IDAT", data)
            + helper.chunk(b"IEND", b"")
        )

    frames = [raw, changed]
    encoder = helper.Encoder()
    encoder.png(raw, WIDTH, HEIGHT)
    turn = [0]

    def spot():
        turn[0] ^= 1
        encoder.png(frames[turn[0]], WIDTH, HEIGHT)

    base = best(rounds, baseline)
    whole = best(rounds, lambda: helper.Encoder().png(raw, WIDTH, HEIGHT))
    partial = best(rounds, spot)
    print(f"baseline, one zlib stream: {base:.1f} ms, {len(baseline())} bytes")
    print(f"band encoder, whole frame: {whole:.1f} ms ({whole / base:.2f}x), {len(helper.Encoder().png(raw, WIDTH, HEIGHT))} bytes")
    print(f"band encoder, a 20x20 spot changed: {partial:.1f} ms ({partial / base:.2f}x)")


if __name__ == "__main__":
    main()
