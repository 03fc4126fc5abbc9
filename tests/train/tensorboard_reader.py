#!/usr/bin/env python3
"""Reads a TensorBoard event file and prints its events as JSON lines, checking every byte on the way.

An independent check of train/observe/tensorboard_writer.h for tests: it shares no code with Cohort and needs
nothing but Python 3's standard library (no protobuf package, no TensorBoard). It implements CRC32C
(table-driven, the reflected Castagnoli polynomial 0x82F63B78) and the protobuf wire format itself.

Usage:
    python3 tensorboard_reader.py FILE     print FILE's events, exit 0; a malformed file: exit 1
    python3 tensorboard_reader.py --self-test     check the CRC32C and varint code on known values

The file is a sequence of TFRecord records:
    [u64 length N][u32 masked CRC32C of the 8 length bytes][N bytes: one Event][u32 masked CRC32C of them]
all little-endian, with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32). Events are
decoded with TensorBoard's field numbers: Event {1: double wall_time, 2: int64 step, 3: string
file_version, 5: Summary summary}, Summary {1: repeated Value value}, Value {1: string tag,
2: float simple_value}. Other fields of any wire type (0, 1, 2, 5) are skipped; a field of TensorBoard's
Value oneof other than simple_value (3, 4, 5, 6, 8: histograms, images, audio, tensors) clears it, as
protobuf would.

OUTPUT FORMAT (stable: end-to-end tests parse it). One JSON object per line on stdout, UTF-8, in file
order; every line has
    "record"     the record's index in the file, from 0
    "offset"     the byte offset of the record's first byte in the file
    "wall_time"  the Event's wall_time (seconds since the Unix epoch; 0.0 when absent)
    "step"       the Event's step, a signed 64-bit integer (0 when absent)
and then, by what the Event holds:
    a file version:  "file_version": "brain.Event:2"                               one line
    a summary:       "tag": "train/loss", "value": 0.25                            one line per Value
                     ("value" is null for a Value without simple_value; a summary with no Values
                     gives one line with neither key)
    neither:         nothing more                                                  one line
Example:
    {"record": 0, "offset": 0, "wall_time": 1700000000.5, "step": 0, "file_version": "brain.Event:2"}
    {"record": 1, "offset": 45, "wall_time": 1700000001.25, "step": 100, "tag": "train/loss", "value": 0.25}
"value" is the stored float32 widened exactly to a double and printed as Python's repr prints it (the
shortest text that reads back to the same double): 0.25 stays 0.25, but a metric of 0.1 reads
0.10000000149011612, so compare with the metric rounded to float32
(struct.unpack("<f", struct.pack("<f", x))[0]). NaN and infinities print as NaN, Infinity and -Infinity
(Python's json module reads them back). Keys appear in the order above.

ERRORS. A malformed file (a length or data CRC that does not match, a record cut short, wire data
that is not a valid Event) stops the reader at that record: it prints one line to stderr,
    tensorboard_reader: FILE: record R at byte OFFSET: what is wrong
and exits 1 (2 for a usage error or an unreadable file). Records before the bad one have already been
printed. An empty file has no records and is not an error.
"""

import json
import struct
import sys

# --- CRC32C -------------------------------------------------------------------------------------

_CASTAGNOLI_REFLECTED = 0x82F63B78


def _crc_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CASTAGNOLI_REFLECTED if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data, crc=0):
    """CRC32C of `data`, continuing from `crc` (the CRC of what came before)."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# --- Protobuf wire format -----------------------------------------------------------------------


class Malformed(Exception):
    """What is wrong with one record; main() adds the record's index and offset."""


def read_varint(data, pos):
    """The unsigned varint at data[pos:] and the position after it."""
    value = 0
    for i in range(10):
        if pos + i >= len(data):
            raise Malformed("varint cut short at byte %d of the event" % (pos + i))
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if value >= 1 << 64:
                raise Malformed("varint over 64 bits at byte %d of the event" % pos)
            return value, pos + i + 1
    raise Malformed("varint longer than 10 bytes at byte %d of the event" % pos)


def fields(data, what):
    """Yields (field number, wire type, value) for each field of the message `data`: an int for wire
    types 0 (varint), 1 (fixed64) and 5 (fixed32), bytes for 2 (length-delimited)."""
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Malformed("%s: field number 0 at byte %d of the event" % (what, start))
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 1 or wire == 5:
            size = 8 if wire == 1 else 4
            if pos + size > len(data):
                raise Malformed("%s: field %d cut short at byte %d of the event" % (what, number, start))
            value = int.from_bytes(data[pos:pos + size], "little")
            pos += size
        elif wire == 2:
            size, pos = read_varint(data, pos)
            if pos + size > len(data):
                raise Malformed("%s: field %d of %d bytes runs past the end at byte %d of the event"
                                % (what, number, size, start))
            value = data[pos:pos + size]
            pos += size
        else:
            raise Malformed("%s: field %d has wire type %d (not 0, 1, 2 or 5) at byte %d of the event"
                            % (what, number, wire, start))
        yield number, wire, value


def expect_wire(what, number, wire, expected):
    if wire != expected:
        raise Malformed("%s: field %d has wire type %d, expected %d" % (what, number, wire, expected))


def utf8(what, raw):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Malformed("%s is not UTF-8 (%s)" % (what, e.reason))


# Value's oneof members besides simple_value (TensorBoard's summary.proto): setting one clears it.
_OTHER_VALUE_KINDS = {3, 4, 5, 6, 8}


def decode_value(data):
    tag, simple_value = "", None
    for number, wire, value in fields(data, "Summary.Value"):
        if number == 1:
            expect_wire("Summary.Value", number, wire, 2)
            tag = utf8("Summary.Value.tag", value)
        elif number == 2:
            expect_wire("Summary.Value", number, wire, 5)
            simple_value = struct.unpack("<f", value.to_bytes(4, "little"))[0]
        elif number in _OTHER_VALUE_KINDS:
            simple_value = None
    return tag, simple_value


def decode_event(data):
    """The Event in `data` as a dict: wall_time, step, and file_version (a str) or summary (a list of
    (tag, value) pairs), the last one set winning as in a protobuf oneof."""
    event = {"wall_time": 0.0, "step": 0}
    for number, wire, value in fields(data, "Event"):
        if number == 1:
            expect_wire("Event", number, wire, 1)
            event["wall_time"] = struct.unpack("<d", value.to_bytes(8, "little"))[0]
        elif number == 2:
            expect_wire("Event", number, wire, 0)
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value  # int64: two's complement
        elif number == 3:
            expect_wire("Event", number, wire, 2)
            event.pop("summary", None)
            event["file_version"] = utf8("Event.file_version", value)
        elif number == 5:
            expect_wire("Event", number, wire, 2)
            event.pop("file_version", None)
            # Repeated occurrences of a message field merge: their Values concatenate.
            summary = event.setdefault("summary", [])
            for snumber, swire, svalue in fields(value, "Summary"):
                if snumber == 1:
                    expect_wire("Summary", snumber, swire, 2)
                    summary.append(decode_value(svalue))
    return event


def output_lines(index, offset, event):
    base = {"record": index, "offset": offset, "wall_time": event["wall_time"], "step": event["step"]}
    if "file_version" in event:
        return [dict(base, file_version=event["file_version"])]
    if event.get("summary"):
        return [dict(base, tag=tag, value=value) for tag, value in event["summary"]]
    return [base]


# --- TFRecord framing ---------------------------------------------------------------------------


def records(data):
    """Yields (index, offset, event bytes) for each record of the file's bytes `data`; raises
    Malformed with .record and .offset set at the first bad one."""
    pos, index = 0, 0
    while pos < len(data):
        def fail(message):
            error = Malformed(message)
            error.record, error.offset = index, pos
            return error

        if pos + 12 > len(data):
            raise fail("cut short: %d bytes left, a record header is 12" % (len(data) - pos))
        length_bytes = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", length_bytes)
        (stored,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if stored != masked_crc32c(length_bytes):
            raise fail("length CRC mismatch: stored 0x%08x, computed 0x%08x over bytes %d..%d"
                       % (stored, masked_crc32c(length_bytes), pos, pos + 8))
        end = pos + 12 + length + 4
        if end > len(data):
            raise fail("cut short: the record needs %d bytes, the file has %d left" % (length + 16, len(data) - pos))
        payload = data[pos + 12:pos + 12 + length]
        (stored,) = struct.unpack("<I", data[end - 4:end])
        if stored != masked_crc32c(payload):
            raise fail("data CRC mismatch: stored 0x%08x, computed 0x%08x over bytes %d..%d"
                       % (stored, masked_crc32c(payload), pos + 12, end - 4))
        yield index, pos, payload
        pos, index = end, index + 1


def self_test():
    # CRC32C check values: RFC 3720's "123456789" and 32 zero bytes (iSCSI's test vectors).
    checks = [
        (crc32c(b"123456789"), 0xE3069283),
        (crc32c(bytes(32)), 0x8A9136AA),
        (crc32c(b"6789", crc32c(b"12345")), 0xE3069283),
        (read_varint(b"\xac\x02", 0), (300, 2)),
        (read_varint(b"\xff" * 9 + b"\x01", 0), ((1 << 64) - 1, 10)),
    ]
    for i, (got, want) in enumerate(checks):
        if got != want:
            print("tensorboard_reader: self-test %d failed: got %r, want %r" % (i, got, want), file=sys.stderr)
            return 1
    print("tensorboard_reader: self-test ok")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: tensorboard_reader.py FILE | --self-test", file=sys.stderr)
        return 2
    path = argv[1]
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        print("tensorboard_reader: %s: %s" % (path, e.strerror), file=sys.stderr)
        return 2
    out = sys.stdout.buffer
    index, offset = 0, 0
    try:
        for index, offset, payload in records(data):
            for line in output_lines(index, offset, decode_event(payload)):
                out.write((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
    except Malformed as e:
        out.flush()
        index, offset = getattr(e, "record", index), getattr(e, "offset", offset)
        print("tensorboard_reader: %s: record %d at byte %d: %s" % (path, index, offset, e), file=sys.stderr)
        return 1
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
