#!/usr/bin/env python3
# Makes the README's picture of the report from a full-page screenshot: keeps the
# given row ranges (stacked), reduces to a 256-colour palette, and writes a small
# PNG (stdlib only).
#   readme_screenshot.py FULL.png OUT.png Y0:Y1 [Y0:Y1 ...]
import struct
import sys
import zlib

from check_png import decode


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def main():
    src, dst, ranges = sys.argv[1], sys.argv[2], sys.argv[3:]
    w, h, ch, rows = decode(src)
    keep = []
    for r in ranges:
        y0, y1 = (int(v) for v in r.split(":"))
        keep.extend(rows[max(0, y0):min(h, y1)])
    counts = {}
    for r in keep:
        for x in range(0, w * ch, ch):
            px = r[x:x + 3]
            counts[px] = counts.get(px, 0) + 1
    palette = [c for c, _ in sorted(counts.items(), key=lambda kv: -kv[1])[:256]]
    index = {c: i for i, c in enumerate(palette)}
    nearest = {}

    def lookup(px):
        i = index.get(px)
        if i is None:
            i = nearest.get(px)
            if i is None:
                i = min(range(len(palette)), key=lambda k: sum((a - b) ** 2 for a, b in zip(px, palette[k])))
                nearest[px] = i
        return i

    raw = bytearray()
    for r in keep:
        raw.append(0)
        raw.extend(lookup(r[x:x + 3]) for x in range(0, w * ch, ch))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, len(keep), 8, 3, 0, 0, 0))
    png += chunk(b"PLTE", b"".join(palette)) + chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + chunk(b"IEND", b"")
    with open(dst, "wb") as f:
        f.write(png)
    print(f"{dst}: {w}x{len(keep)}, {len(png)} bytes, {len(palette)} colours")


if __name__ == "__main__":
    main()
