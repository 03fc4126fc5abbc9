#!/usr/bin/env python3
"""The message sizes of a `cohort bench allreduce` sweep, in bytes, comma-separated: MIN, MIN*F, ...
up to MAX (K/M/G = 2^10/2^20/2^30, as cohort reads them), for handing the same rows to a peer.

  bench/byte_sizes.py MIN MAX F      e.g. 16M 256M 4 -> 16777216,67108864,268435456
"""
import re
import sys


def parse(text):
    m = re.fullmatch(r"(\d+)([KMG]?)(I?B)?", text.upper())
    if not m:
        sys.exit(f"bad byte size '{text}': expected a number with an optional K, M or G suffix")
    return int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2]]


def main():
    size, top, factor = parse(sys.argv[1]), parse(sys.argv[2]), int(sys.argv[3])
    out = []
    while size <= top:
        out.append(str(size))
        size *= factor
    print(",".join(out))


if __name__ == "__main__":
    main()
