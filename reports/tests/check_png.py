#!/usr/bin/env python3
# Checks that a screenshot of the report shows something: the PNG exists, is larger
# than a few KB, decodes (8-bit RGB/RGBA, zlib + row filters, stdlib only), and is
# neither a single colour nor nearly blank. Used by the ctest that renders the
# fixture report in headless Chromium.
#   check_png.py FILE [--min-kb N] [--min-colours N] [--min-ink FRACTION]
import argparse
import struct
import sys
import zlib


def decode(path):
    """Returns (width, height, channels, rows) with rows as bytes per row, unfiltered."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file (bad signature)")
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if ihdr is None:
        raise ValueError("no IHDR chunk")
    width, height, depth, colour, _, _, interlace = ihdr
    channels = {2: 3, 6: 4}.get(colour)
    if depth != 8 or channels is None or interlace != 0:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 255
            elif ftype != 0:
                raise ValueError(f"bad filter type {ftype} in row {y}")
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("png")
    ap.add_argument("--min-kb", type=float, default=20)
    ap.add_argument("--min-colours", type=int, default=32)
    ap.add_argument("--min-ink", type=float, default=0.02, help="fraction of pixels unlike the most common colour")
    a = ap.parse_args()
    try:
        with open(a.png, "rb") as f:
            size = len(f.read())
    except OSError as e:
        print(f"check_png: {a.png}: {e}", file=sys.stderr)
        return 1
    if size < a.min_kb * 1024:
        print(f"check_png: {a.png} is {size} bytes, under {a.min_kb} KB: the page rendered nearly empty", file=sys.stderr)
        return 1
    try:
        w, h, ch, rows = decode(a.png)
    except (ValueError, zlib.error, struct.error) as e:
        print(f"check_png: {a.png}: cannot decode: {e}", file=sys.stderr)
        return 1
    counts = {}
    # Every 2nd pixel of every 2nd row is plenty to judge colour variety and ink.
    for y in range(0, h, 2):
        r = rows[y]
        for x in range(0, w * ch, 2 * ch):
            px = r[x:x + 3]
            counts[px] = counts.get(px, 0) + 1
    total = sum(counts.values())
    common = max(counts.values())
    ink = 1 - common / total
    print(f"check_png: {a.png}: {w}x{h}, {size} bytes, {len(counts)} colours, {ink:.1%} ink")
    if len(counts) < a.min_colours:
        print(f"check_png: only {len(counts)} distinct colours (need {a.min_colours}): not a rendered report",
              file=sys.stderr)
        return 1
    if ink < a.min_ink:
        print(f"check_png: {ink:.2%} of pixels differ from the background (need {a.min_ink:.0%})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
