"""The one exception type the tool raises on bad input.

Every ``OverlayError`` carries three parts, in the shape ghstack and
patch-package use:

* ``what``  -- what failed, naming the object and its version;
* ``cause`` -- the likely cause;
* ``next``  -- the next command to run.

The CLI prints ``str(err)`` without a traceback and exits with status 2.
Any other exception is a bug in the tool and keeps its traceback.
"""

from __future__ import annotations


class OverlayError(Exception):
    def __init__(self, what: str, *, cause: str, next: str) -> None:
        self.what = what
        self.cause = cause
        self.next = next
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return (
            f"error: {self.what}\n"
            f"  likely cause: {self.cause}\n"
            f"  next: {self.next}"
        )

    def __str__(self) -> str:
        return self.message
