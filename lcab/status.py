"""The status of a result row: a type, never a sentinel number."""

import enum


class Status(str, enum.Enum):
    OK = "OK"
    OOM = "OOM"  # out of device memory; figures print E
    UNSUPPORTED = "UNSUPPORTED"  # the backend cannot express this exactly; figures print X
    UNAVAILABLE = "UNAVAILABLE"  # a dependency or the device is missing
    ERROR = "ERROR"  # anything else went wrong; the reason says what
    MISMATCH = "MISMATCH"  # ran, but disagrees with lcab.reference

    def __str__(self) -> str:
        return self.value


# How tables and figures show a row that has no number.
CODES = {
    Status.OOM: "E",
    Status.UNSUPPORTED: "X",
    Status.UNAVAILABLE: "-",
    Status.ERROR: "ERR",
    Status.MISMATCH: "MM",
}
