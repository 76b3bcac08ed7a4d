"""Errors a user can fix.

Anything raised as :class:`UserError` is printed by the CLI as one line on stderr
and ends the process with exit code 2: no traceback, because the user did nothing
wrong with the code, only with the input.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: unknown name, malformed spec, impossible size, missing/corrupt file.

    The message must name what to change.
    """


class CheckpointCorrupt(UserError):
    """A checkpoint failed verification (missing file, bad checksum, truncated)."""
