"""The user-facing error: raised for bad input, files or environment, never for a bug.

The command line prints a :class:`GnnweaveError` as one line and exits 2; anything else is
a bug in gnnweave and keeps its traceback.
"""


class GnnweaveError(Exception):
    """A problem the user can fix; the message names the option, file, field or tool."""

    #: the process holds native state that the interpreter's teardown cannot release (a
    #: process group after a failed collective): the command line leaves with ``os._exit``
    #: after the message instead of a normal exit
    exit_at_once = False


class InputError(GnnweaveError, ValueError):
    """A bad value given by the user (an option, a configuration field, a file's contents).

    Also a :class:`ValueError`, so callers that catch that keep working.
    """
