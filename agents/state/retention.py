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
- `judged_at`: the time a record is judged at, from its log time, bounded so that no
  producer's clock can move a partition ahead (docs/architecture.md, "How time enters").
"""

from __future__ import annotations

DEFAULT_RETENTION_S = 600.0
# How far ahead of the reading worker's clock a record's log time is believed (the default is a
# tenth of the default retention, `worker.max_clock_skew_s`).
DEFAULT_MAX_SKEW_S = 60.0


def stale(scheduled_at: float, log_time: float, retention_s: float) -> bool:
    """A claim (or its answer) read at `log_time`, from a cycle begun at `scheduled_at`, is
    too old to act on. Unstamped records (0) and unknown log times (0) are not."""
    return scheduled_at > 0 and log_time > 0 and log_time - scheduled_at > retention_s / 2


def expired(since: float, now: float, retention_s: float) -> bool:
    """What finished at log time `since` (0: not finished) may be forgotten at `now`."""
    return since > 0 and now - since > retention_s


def judged_at(stamped: float, floor: float, edge: float, replayed: bool) -> float:
    """The time a record with log time `stamped` is judged at, in a partition whose clock (the
    newest time decided from it, saved with the table) is `floor`.

    - Never before `floor`: a record read again after a crash is judged at least as late as
      what was decided before it.
    - `replayed` (its offset is below what `floor` covers: it was decided already, and the
      table holds what it decided): at `floor` exactly, so a replay computes its times from
      the log and the saved table alone, whatever the wall clock says when it comes.
    - Otherwise at most `edge`: the reading worker's wall clock plus the skew it admits, read
      once per run at intake, when the record is first decided. A producer whose clock runs
      ahead (a record stamped a day ahead) then moves the partition's clock by at most the
      skew, instead of making every later claim look older than half the retention.
    """
    if replayed:
        return floor
    return max(floor, min(stamped, edge))
