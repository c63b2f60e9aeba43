"""How long owners and deciders keep what a finished pod leaves behind, and which late
records they refuse (DESIGN.md, rule 10; the argument is in docs/architecture.md, "How long
state is kept").

Times are log times: a record's timestamp in its input partition, never a clock read during
a decision, so a redelivered record is judged the same way every time it comes.

- `stale`: a claim (or the Held or Rejected that answers it) whose log time is more than
  half the retention after the scheduler's cycle that placed it began. It is refused (a
  Rejected at an owner; a Release, and for a pending pod a Requeue, at a decider), and a
  decider that does not know its pod keeps nothing of it.
- `expired`: an entry finished (a hold released, rejected or terminated; a pod deleted) at
  log time `since` is forgotten once a record of its key is read at `now` more than the
  retention later.
"""

from __future__ import annotations

DEFAULT_RETENTION_S = 600.0


def stale(scheduled_at: float, log_time: float, retention_s: float) -> bool:
    """A claim (or its answer) read at `log_time`, from a cycle begun at `scheduled_at`, is
    too old to act on. Unstamped records (0) and unknown log times (0) are not."""
    return scheduled_at > 0 and log_time > 0 and log_time - scheduled_at > retention_s / 2


def expired(since: float, now: float, retention_s: float) -> bool:
    """What finished at log time `since` (0: not finished) may be forgotten at `now`."""
    return since > 0 and now - since > retention_s
