"""Prints what a screenshot shows, as JSON: its size, how many distinct colours it has, and
the share of pixels that differ from its most common colour (a blank page is one colour).
Decodes 8-bit RGB and RGBA PNG files, as Chromium writes them, with the standard library.

Usage: png_stats.py FILE.png
"""

import json
import struct
import sys
import zlib
from collections import Counter


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode(data):
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit("not a PNG file")
    offset, idat, header = 8, bytearray(), None
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset:offset + 4])
        kind = data[offset + 4:offset + 8]
        body = data[offset + 8:offset + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        offset += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise SystemExit(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(bytes(idat)), width * bpp
    rows, previous = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = previous[i]
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                line[i] = (line[i] + paeth(left, up, previous[i - bpp] if i >= bpp else 0)) & 0xFF
        rows.append(line)
        previous = line
    return width, height, bpp, rows


def main():
    with open(sys.argv[1], "rb") as handle:
        width, height, bpp, rows = decode(handle.read())
    colours = Counter(bytes(row[x:x + 3]) for row in rows for x in range(0, width * bpp, bpp))
    most = colours.most_common(1)[0][1]
    print(json.dumps({"width": width, "height": height, "colours": len(colours),
                      "notBackground": 1 - most / (width * height)}))


if __name__ == "__main__":
    main()
