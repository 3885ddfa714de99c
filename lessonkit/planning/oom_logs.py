"""Reading a log of any length as a stream, for the last out-of-memory error in it.

``OOMLogReader`` takes the log in pieces of any size (``feed``) and keeps only what it still
needs: the text of the last error found (``BODY_CHARS`` characters from its first word) and the
last ``OVERLAP`` characters, so that nothing is cut in two between pieces. What wraps the error
(Trainer, torchrun, accelerate's batch search) is noted wherever it appears in the log. Every
pattern here has a bounded length and is tried once per position, so a log is read in time
linear in its length, whatever it holds (runs of blank lines, digits or rank prefixes).
``close`` returns what was found (``LogFindings``: the last error's text and what wrapped it),
which planning/oom_messages.py reads into an ``OOMMessage``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

BODY_CHARS = 65_536  # raw characters kept from an error's first word: rank prefixes and spaces
OVERLAP = 256  # longer than any pattern's match, so a match cut between pieces is found whole
CHUNK = 2**20  # characters of a string fed at a time

ANCHOR = re.compile(
    r"(CUDA|HIP|XPU) out of memory|MPS backend out of memory|CUDA error: out of memory|"
    r"CUBLAS_STATUS_ALLOC_FAILED|No executable batch size found, reached zero|"
    r"DefaultCPUAllocator: can't allocate memory|OutOfMemoryError",
    re.I,
)
WRAPPERS = (
    ("Trainer", re.compile(r"transformers[/\\]trainer\.py|_inner_training_loop|Trainer\.train\b")),
    (
        "auto_find_batch_size",
        re.compile(r"No executable batch size found|find_executable_batch_size"),
    ),
    ("torchrun", re.compile(r"\[rank\d{1,9}\]:|ChildFailedError")),
)
# accelerate's find_executable_batch_size logs each try; more digits than any batch: unreadable
BATCH_TRY = re.compile(r"Decreasing batch size to:? (\d{1,30})(\d?)")


@dataclass
class LogFindings:
    """What a log holds: the last error's text (from its first word, BODY_CHARS at most), what
    wrapped it, and accelerate's last batch size tried (None: unreadable; absent: no try)."""

    body: str
    wrapped_by: list[str] = field(default_factory=list)
    batch_tried: bool = False
    last_batch_size: int | None = None


class OOMLogReader:
    """The last out-of-memory error of a log fed in pieces (see the module docstring)."""

    def __init__(self) -> None:
        self._buffer = ""  # the log's last characters, OVERLAP or a little more
        self._base = 0  # position in the log of the buffer's first character
        self._error_at: int | None = None  # where the chosen error starts
        self._named = False  # whether the chosen error names its kind (else a bare one)
        self._body: list[str] = []  # the chosen error's text, BODY_CHARS at most
        self._body_length = 0
        self._body_end = 0  # position in the log up to which the body is collected
        self._wrappers: set[str] = set()
        self._batch: tuple[int | None, int] | None = None  # (value or None, where)

    def feed(self, text: str) -> None:
        """Read the next piece of the log."""
        self._buffer += text
        self._scan(final=False)

    def feed_text(self, text: str) -> None:
        """Read a string of any length, a CHUNK at a time."""
        for start in range(0, len(text), CHUNK):
            self.feed(text[start : start + CHUNK])

    def close(self) -> LogFindings | None:
        """What was found in everything fed, or None when it holds no error."""
        self._scan(final=True)
        if self._error_at is None:
            return None
        return LogFindings(
            "".join(self._body),
            [name for name, _ in WRAPPERS if name in self._wrappers],
            self._batch is not None,
            None if self._batch is None else self._batch[0],
        )

    def _scan(self, final: bool) -> None:
        buffer, base = self._buffer, self._base
        # The buffer starts where the last scan's overlap began: the matches in the overlap are
        # found again, and those already taken are told apart by their position in the log.
        # A match that ends at the buffer's end may go on in the next piece: it waits for it
        limit = len(buffer) if final else len(buffer) - 1
        for match in ANCHOR.finditer(buffer):
            if match.end() > limit:
                break
            named = match.group(0).lower() != "outofmemoryerror"
            where = base + match.start()
            if (named or not self._named) and (self._error_at is None or where > self._error_at):
                self._error_at, self._named = where, named
                self._body, self._body_length, self._body_end = [], 0, where
        for name, pattern in WRAPPERS:
            if name not in self._wrappers:
                found = pattern.search(buffer)
                if found and found.end() <= limit:
                    self._wrappers.add(name)
        for match in BATCH_TRY.finditer(buffer):
            if match.end() > limit:
                break
            where = base + match.start()
            if self._batch is None or where > self._batch[1]:
                digits = match.group(1) + match.group(2)
                self._batch = (int(digits) if len(digits) <= 30 else None, where)
        if self._error_at is not None and self._body_length < BODY_CHARS:
            piece = buffer[self._body_end - base : len(buffer)]
            piece = piece[: BODY_CHARS - self._body_length]
            self._body.append(piece)
            self._body_length += len(piece)
            self._body_end += len(piece)
        keep = max(0, len(buffer) - OVERLAP)
        self._buffer, self._base = buffer[keep:], base + keep
