"""runcell's wire framing, shared by the in-sandbox Python kernels (runcell_kernel.py and
bash/runcell_bash_kernel.py). crates/protocol/src/lib.rs is the host's side of it, and
javascript/runcell_js_kernel.js has its own copy for Node.js.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON, one object,
at most MAX_FRAME bytes. How the bytes move (a socket, a file descriptor, signal masks around
writes) is each kernel's business; this module only makes and checks frames.

It ships beside the kernels: the host writes it into the kernel directory every sandbox and
the zygote put first on sys.path, so a kernel imports it as a top-level module. Stdlib only.
"""

import json
import struct

# The protocol channel, a Unix stream socket the host puts there.
CHANNEL_FD = 3
MAX_FRAME = 64 * 1024 * 1024

_HEADER = struct.Struct(">I")


class ProtocolViolation(Exception):
    """The host sent something that is not a well-formed frame."""


class FrameTooLarge(ValueError):
    """A message would not fit in one frame; nothing was sent."""


def encode(message, text=None, limit=MAX_FRAME):
    """One frame for message (or for `text`, its JSON text made by the caller);
    FrameTooLarge if its body is over `limit` bytes."""
    if text is None:
        text = json.dumps(message, ensure_ascii=False)
    # errors="replace": lone surrogates in user strings are not valid UTF-8.
    body = text.encode("utf-8", "replace")
    if len(body) > limit:
        raise FrameTooLarge(f"message of {len(body)} bytes is over the {limit}-byte limit")
    return _HEADER.pack(len(body)) + body


def read_message(read_exact):
    """The next message, or None on a clean end of file between frames.

    `read_exact(n)` returns exactly n bytes, or None at a clean end of file, and raises
    ProtocolViolation if the channel closes part-way through them."""
    header = read_exact(4)
    if header is None:
        return None
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolViolation(f"frame of {length} bytes is over the {MAX_FRAME}-byte limit")
    body = read_exact(length) if length else b""
    if body is None:
        raise ProtocolViolation("channel closed in the middle of a frame")
    try:
        message = json.loads(body.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise ProtocolViolation(f"frame is not UTF-8 JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolViolation("frame is not a JSON object")
    return message
