"""The one exception domain code raises; the CLI turns it into one line and an exit code."""

EXIT_FAILED = 1
"""rayscope failed, or (status) the answer is partial, or (fit) it does not fit."""
EXIT_NO_DATA = 2
"""The cluster could not be read at all, or bad usage (click's code for usage errors)."""


class AgentError(Exception):
    """A failure the operator can act on: ``str(err)`` is the whole message.

    ``exit_code`` follows the CLI contract: 1 = failed / partial, 2 = no data
    (the cluster could not be read at all) or bad usage.
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
