"""When ``push`` stops retrying: failures only the operator can fix, counted in a row.

A wrong or missing token, or a ``--head`` that is not a head's report port (its HTTP port,
a GCS, TLS on one side only), fails the same way on every try: after :data:`GIVE_UP_TRIES`
of them with no report taken in between, the agent exits with one line and
:data:`~rayscope.errors.EXIT_USAGE`, so that a supervisor shows it failed instead of active.
Anything else (the head away, stalled, full, a connection cut) is retried for ever.
"""

from rayscope.errors import EXIT_USAGE, AgentError

GIVE_UP_TRIES = 5
"""Tries of one hopeless failure before the agent exits: with the backoff (1, 2, 4, 8 s),
about 15 s after the first; a head restarted with the right token meanwhile is taken."""


class Hopeless:
    """Counts the tries in a row that failed for a reason retrying cannot fix."""

    def __init__(self, tries: int = GIVE_UP_TRIES) -> None:
        self.tries = tries
        self.failed = 0

    def reset(self) -> None:
        """A report was taken: whatever failed before fixed itself."""
        self.failed = 0

    def again(self, what: str) -> None:
        """One more try failed for ``what`` (``head H:P rejected ...``); raises
        :class:`~rayscope.errors.AgentError` on the last."""
        self.failed += 1
        if self.failed >= self.tries:
            said = f"{what}; gave up after {self.failed} tries (retrying cannot fix it)"
            raise AgentError(said, EXIT_USAGE)
