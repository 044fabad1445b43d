"""Errors of the tributary module: one exception class per Status code.

Every failure of the C++ library (a ``Status`` that is not OK) is raised as an instance of
``tributary.Error`` -- more precisely of the subclass for its code -- carrying

* ``code``: a :class:`StatusCode` (``StatusCode.INVALID_ARGUMENT``, ...), and
* ``message``: the library's message (what happened, which argument or rank, what to do).

The subclasses also derive from the built-in exception that means the same, so ``except
ValueError`` catches a bad argument and ``except TimeoutError`` a deadline:

=========================  ======================  ==========================
code                       class                   also a
=========================  ======================  ==========================
INVALID_ARGUMENT           InvalidArgumentError    ValueError (DTypeError: and TypeError)
NOT_FOUND                  NotFoundError           LookupError
UNIMPLEMENTED              UnimplementedError      NotImplementedError
FAILED_PRECONDITION        FailedPreconditionError RuntimeError
DEADLINE_EXCEEDED          DeadlineExceededError   TimeoutError
UNAVAILABLE                UnavailableError        ConnectionError
ABORTED                    AbortedError            RuntimeError
OUT_OF_RANGE               OutOfRangeError         IndexError
RESOURCE_EXHAUSTED         ResourceExhaustedError  MemoryError
INTERNAL                   InternalError           RuntimeError
DATA_LOSS                  DataLossError           RuntimeError
=========================  ======================  ==========================

``DTypeError`` (an ``InvalidArgumentError`` and a ``TypeError``) is raised for an object of a
dtype or kind tributary cannot use.
"""

import enum


class StatusCode(enum.IntEnum):
    """The codes of tributary's Status (include/tributary/status.h), with the same values."""

    OK = 0
    INVALID_ARGUMENT = 1
    NOT_FOUND = 2
    UNIMPLEMENTED = 3
    FAILED_PRECONDITION = 4
    DEADLINE_EXCEEDED = 5
    UNAVAILABLE = 6
    ABORTED = 7
    OUT_OF_RANGE = 8
    RESOURCE_EXHAUSTED = 9
    INTERNAL = 10
    DATA_LOSS = 11


class Error(Exception):
    """A failed tributary call: ``code`` (a StatusCode) and ``message``."""

    code = StatusCode.INTERNAL

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = StatusCode(code)

    def __str__(self):
        return f"{self.code.name.lower()}: {self.message}"


class InvalidArgumentError(Error, ValueError):
    code = StatusCode.INVALID_ARGUMENT


class DTypeError(InvalidArgumentError, TypeError):
    code = StatusCode.INVALID_ARGUMENT


class NotFoundError(Error, LookupError):
    code = StatusCode.NOT_FOUND


class UnimplementedError(Error, NotImplementedError):
    code = StatusCode.UNIMPLEMENTED


class FailedPreconditionError(Error, RuntimeError):
    code = StatusCode.FAILED_PRECONDITION


class DeadlineExceededError(Error, TimeoutError):
    code = StatusCode.DEADLINE_EXCEEDED


class UnavailableError(Error, ConnectionError):
    code = StatusCode.UNAVAILABLE


class AbortedError(Error, RuntimeError):
    code = StatusCode.ABORTED


class OutOfRangeError(Error, IndexError):
    code = StatusCode.OUT_OF_RANGE


class ResourceExhaustedError(Error, MemoryError):
    code = StatusCode.RESOURCE_EXHAUSTED


class InternalError(Error, RuntimeError):
    code = StatusCode.INTERNAL


class DataLossError(Error, RuntimeError):
    code = StatusCode.DATA_LOSS


_BY_CODE = {
    cls.code: cls
    for cls in (InvalidArgumentError, NotFoundError, UnimplementedError, FailedPreconditionError,
                DeadlineExceededError, UnavailableError, AbortedError, OutOfRangeError,
                ResourceExhaustedError, InternalError, DataLossError)
}


def _from_status(code, message, type_error=False):
    """The exception for a Status (called by the extension module)."""
    code = StatusCode(code)
    if type_error and code == StatusCode.INVALID_ARGUMENT:
        return DTypeError(message)
    cls = _BY_CODE.get(code)
    return cls(message) if cls is not None else Error(message, code)


__all__ = [
    "StatusCode", "Error", "InvalidArgumentError", "DTypeError", "NotFoundError",
    "UnimplementedError", "FailedPreconditionError", "DeadlineExceededError", "UnavailableError",
    "AbortedError", "OutOfRangeError", "ResourceExhaustedError", "InternalError", "DataLossError",
]
