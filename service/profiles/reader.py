"""Streaming reader for Chrome/Kineto trace JSON (plain or gzip).

Contract: ``read_trace(path, on_event)`` parses the top-level JSON object incrementally and calls
``on_event`` once per element of ``traceEvents``; it returns the other top-level keys (metadata).
Memory stays bounded by the chunk size plus the largest single JSON value (an event, or a metadata
value such as ``deviceProperties``): the file as a whole is never held in memory. A single value larger
than ``max_value_chars`` is rejected, so a pathological file cannot grow the buffer without bound.

``read_trace(..., batch=EventBatches(decoder, on_batch))`` is the fast path: the ``traceEvents`` elements
that sit in the buffer are cut after their last ``},`` and decoded together by msgspec into typed
structs (skipping the fields that the decoder's type does not name), which ``on_batch`` receives in
file order. A cut can only decode if it lies between two elements (a prefix of JSON text that ends
inside a string or a nested value is never valid), so a failed decode, or an element msgspec will not
take (NaN, a non-object), sends the elements up to that cut through the generic decoder and
``on_event`` instead: the same values and errors as without ``batch``, only slower.
"""

from __future__ import annotations

import codecs
import io
import json
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec

from service.profiles.errors import TraceError

CHUNK_CHARS = 1 << 15  # the lowest peak over the benchmark's trace sets (benchmarks/results/profile_analyze.md)
BATCH_CHARS = 1 << 14
GZIP_INPUT_BYTES = 1 << 14
CUT_TOKEN_CHARS = 12  # the longest JSON token a chunk's end can cut short: \ud83d\ude80
DEFAULT_MAX_VALUE_CHARS = 64 << 20
_NOT_WS = re.compile(r"[^ \t\r\n]")


class _GzipText:
    """The UTF-8 text of a gzip file (one member or several, zero padding between them skipped, as
    ``gzip`` reads them), inflated as it is read, with its input and output both bounded.

    ``gzip.open(..., "rt")`` asks its buffered reader for each chunk as one bytes object (128 KB for a
    chunk of 64 Ki characters, as chunks then were) while zlib's output blocks are still alive (about
    100 KB), then decodes it: on a rank of a few thousand events that was half the reading's peak (478
    against 276 KB). Here the compressed input comes ``GZIP_INPUT_BYTES`` at a time and the text is
    inflated and decoded piece by piece. zlib checks the header as well as the trailer: a header CRC
    that does not match, or a reserved flag set, which ``gzip`` ignores, is refused here. Raises
    ``EOFError`` where the file ends inside a member, ``zlib.error`` for corrupt data (a wrong checksum
    or length included) or a non-gzip rest, and ``UnicodeDecodeError`` for text that is not UTF-8 (a
    sequence cut at the end included)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.inflate = zlib.decompressobj(wbits=31)  # 16 + 15: a gzip header and trailer, checked
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.ended = False

    def read(self, chars: int) -> str:
        """Up to `chars` characters, as many as the next piece of input inflates to (a read may come
        short, unlike a text file's); '' only at the end of the file."""
        while not self.ended:
            data = self._inflated(chars)  # a byte is at most a character: never more than asked for
            text = self.utf8.decode(data, final=not data)
            if text:
                return text
            self.ended = not data
        return ""

    def _inflated(self, size: int) -> bytes:
        """Up to `size` more bytes of the uncompressed stream; b'' at the end of the file."""
        while True:
            if self.inflate.eof:  # a member ended: another may follow, after zero padding
                data = self.inflate.unused_data.lstrip(b"\0")
                while not data:
                    more = self.raw.read(GZIP_INPUT_BYTES)
                    if not more:
                        return b""
                    data = more.lstrip(b"\0")
                self.inflate = zlib.decompressobj(wbits=31)
            else:
                data = self.inflate.unconsumed_tail or self.raw.read(GZIP_INPUT_BYTES)
            out = self.inflate.decompress(data, size)
            if out:
                return out
            if not data and not self.inflate.eof:
                raise EOFError("the file ends before the compressed data does")

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> _GzipText:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_text(path: Path) -> IO[str] | _GzipText:
    raw = path.open("rb")
    try:
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
    except OSError:
        raw.close()
        raise
    if gzipped:
        return _GzipText(raw)
    return io.TextIOWrapper(raw, encoding="utf-8")  # what path.open("r") gives, without opening it again


class _Scanner:
    """A sliding text buffer over a file with a JSON value decoder that refills on demand."""

    def __init__(self, path: Path, fh: IO[str] | _GzipText, max_value_chars: int) -> None:
        self.path = path
        self.fh = fh
        self.max_value_chars = max_value_chars
        self.buf = ""
        self.pos = 0
        self.base = 0  # offset in the file's text of buf[0]
        self.eof = False
        self.decoder = json.JSONDecoder()

    def _fill(self, chars: int = CHUNK_CHARS, *, whole: bool = False) -> bool:
        """Read up to `chars` more characters into the buffer (dropping what was consumed); with
        `whole`, all `chars` unless the file ends first (a gzip file's reads come short). False at
        the end of the file."""
        if self.eof:
            return False
        pieces: list[str] = []
        wanted = chars
        while wanted > 0:
            try:
                piece = self.fh.read(wanted)
            except (EOFError, zlib.error) as exc:
                raise TraceError(self.path, f"truncated or corrupt gzip stream ({exc})") from exc
            except UnicodeDecodeError as exc:
                raise TraceError(self.path, f"not UTF-8 text, so not a JSON trace ({exc.reason})") from exc
            if not piece:
                self.eof = True
                break
            pieces.append(piece)
            wanted -= len(piece)
            if not whole:
                break
        if not pieces:
            return False
        chunk = "".join(pieces)
        if self.pos:
            self.buf = self.buf[self.pos :]
            self.base += self.pos
            self.pos = 0
        self.buf += chunk
        return True

    def peek(self) -> str:
        """Skip whitespace and return the next character ('' at end of input)."""
        while True:
            found = _NOT_WS.search(self.buf, self.pos)
            if found:
                self.pos = found.start()
                return self.buf[self.pos]
            self.pos = len(self.buf)  # all whitespace: drop it before reading on
            if not self._fill():
                return ""

    def expect(self, chars: str, where: str) -> str:
        ch = self.peek()
        if ch == "" or ch not in chars:
            found = "end of file" if ch == "" else repr(ch)
            raise TraceError(
                self.path,
                f"not a JSON trace: expected {' or '.join(map(repr, chars))} {where}, found {found}",
            )
        self.pos += 1
        return ch

    def value(self, where: str) -> Any:
        """Decode one complete JSON value at the current position."""
        self.peek()
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                # The buffer may end inside the value. An unterminated string is reported where it
                # starts; anything else cut short (a literal, a number's exponent, a \uXXXX escape or a
                # surrogate pair of them) within its last CUT_TOKEN_CHARS.
                truncated = exc.msg.startswith("Unterminated string") or exc.pos >= len(self.buf) - CUT_TOKEN_CHARS
                if truncated and self._need_more():
                    continue
                raise TraceError(self.path, f"invalid JSON {where}: {exc.msg} (char {exc.pos})") from exc
            except ValueError as exc:  # an integer past Python's int_max_str_digits
                raise TraceError(self.path, f"invalid JSON {where}: {exc}") from exc
            scalar_at_end = end >= len(self.buf) and not isinstance(obj, dict | list | str)
            if scalar_at_end and not self.eof and self._fill():  # a number may continue in the next chunk
                continue
            if end - self.pos > self.max_value_chars:
                self._too_large()
            self.pos = end
            return obj

    def _too_large(self) -> None:
        raise TraceError(
            self.path,
            f"a single JSON value is larger than {self.max_value_chars} characters; refusing to buffer it",
        )

    def _need_more(self) -> bool:
        """Read on for a value that does not end in the buffer. As much again as the value holds so
        far (at least a chunk, at most up to the limit), whole once the value is a chunk or more: each
        decode attempt rescans the value from its start, so growing it by a chunk or by a gzip file's
        short read at a time would cost time quadratic in its size (a gzip trace's 20 Mi-character
        value took 828 attempts and 7.7 s that way). A smaller value reads what comes, which keeps the
        buffers of a common element cut by the buffer's end at one piece."""
        pending = len(self.buf) - self.pos
        if pending > self.max_value_chars:
            self._too_large()
        return self._fill(max(CHUNK_CHARS, min(pending, self.max_value_chars + 1 - pending)),
                          whole=pending >= CHUNK_CHARS)


@dataclass(frozen=True)
class EventBatches:
    """The fast path for ``traceEvents``: ``decoder`` decodes a JSON array of events into a list of
    typed structs, handed to ``on_batch``."""

    decoder: msgspec.json.Decoder[list[Any]]
    on_batch: Callable[[list[Any]], None]


def _read_events_batched(sc: _Scanner, batch: EventBatches, on_event: Callable[[Any], None]) -> None:
    """Consume the ``traceEvents`` array (its '[' already read), in batches where the text allows."""
    slow_until = -1  # absolute offset up to which elements go one by one (a cut there did not decode)
    while True:
        if sc.peek() == "]":
            sc.pos += 1
            return
        cut = sc.buf.rfind("},", sc.pos, sc.pos + min(BATCH_CHARS, sc.max_value_chars))
        if cut >= sc.pos and sc.base + cut > slow_until:
            try:
                events = batch.decoder.decode("[" + sc.buf[sc.pos : cut + 1] + "]")
            except (msgspec.DecodeError, msgspec.ValidationError):
                slow_until = sc.base + cut
            else:
                batch.on_batch(events)
                del events
                sc.pos = cut + 2
                if len(sc.buf) - sc.pos < BATCH_CHARS:
                    sc._fill()
                continue
        on_event(sc.value("in traceEvents"))
        if sc.expect(",]", "after an element of traceEvents") == "]":
            return


def _iter_array(sc: _Scanner, where: str) -> Iterator[Any]:
    sc.expect("[", f"at the start of {where}")
    if sc.peek() == "]":
        sc.pos += 1
        return
    while True:
        yield sc.value(f"in {where}")
        if sc.expect(",]", f"after an element of {where}") == "]":
            return


def read_trace(
    path: Path,
    on_event: Callable[[Any], None],
    max_value_chars: int = DEFAULT_MAX_VALUE_CHARS,
    batch: EventBatches | None = None,
) -> dict[str, Any]:
    """Stream ``path``; call ``on_event`` for each ``traceEvents`` element; return the other keys.

    With ``batch``, most elements arrive decoded as structs through ``batch.on_batch`` instead, the
    rest (see the module docstring) through ``on_event``, all in file order.

    Raises ``TraceError`` when the file is missing, is not JSON, is truncated, has no ``traceEvents``
    array, or holds a single value over ``max_value_chars``.
    """
    try:
        fh = _open_text(path)
    except OSError as exc:
        raise TraceError(path, f"cannot open: {exc.strerror or exc}") from exc
    meta: dict[str, Any] = {}
    seen_events = False
    with fh:
        sc = _Scanner(path, fh, max_value_chars)
        first = sc.peek()
        if first != "{":
            raise TraceError(
                path,
                "not a JSON trace: expected a JSON object ('{') at the start of the file, found "
                + ("end of file" if first == "" else repr(first)),
            )
        sc.pos += 1
        if sc.peek() == "}":
            sc.pos += 1
        else:
            while True:
                key = sc.value("as an object key")
                if not isinstance(key, str):
                    raise TraceError(path, "not a JSON trace: object key is not a string")
                sc.expect(":", f"after key {key!r}")
                if key == "traceEvents":
                    seen_events = True
                    if batch is not None:
                        sc.expect("[", "at the start of traceEvents")
                        _read_events_batched(sc, batch, on_event)
                    else:
                        for event in _iter_array(sc, "traceEvents"):
                            on_event(event)
                else:
                    meta[key] = sc.value(f"in the value of {key!r}")
                if sc.expect(",}", "between top-level keys") == "}":
                    break
        if sc.peek() != "":
            raise TraceError(path, "not a JSON trace: extra data after the top-level object")
    if not seen_events:
        raise TraceError(path, "JSON has no 'traceEvents' array: not a Chrome/Kineto trace")
    return meta
