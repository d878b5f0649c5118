"""How long a reconcile loop stays idle between two passes: a pure rule, so it is tested alone.

Two bounds, the larger wins:
- Coalescing: after a watch event the loop waits a whole window, so a burst of events (a rotation
  rewriting thousands of replicas) is one pass, not one per event. A timed wakeup (a settle period
  ending, a re-issue due) has nothing to coalesce: it only keeps passes a window apart.
- Duty: a loop whose passes are expensive (the rollout plans over every VMI: about a second of CPU
  at 20,000 VMIs) stays idle `idle_per_busy` times its last pass's CPU time, so it takes at most
  1 / (1 + idle_per_busy) of the interpreter while its inputs keep changing, and the replica writes,
  informers and /metrics that share the event loop keep the rest. A cheap pass (milliseconds) is
  never held back by it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pacing:
    window: float  # seconds: the coalescing window
    idle_per_busy: float = 0.0  # idle seconds per CPU second of the last pass (0: no duty bound)


def idle_before_next_pass(p: Pacing, *, triggered: bool, since_start: float, since_end: float,
                          pass_cpu: float) -> float:
    """Seconds to sleep now, before the next pass.

    triggered: woken by a watch event (else by the pass's own timed wakeup or the resync);
    since_start / since_end: seconds since the last pass started / ended; pass_cpu: its CPU seconds."""
    coalesce = p.window if triggered else p.window - since_start
    duty = p.idle_per_busy * pass_cpu - since_end
    return max(0.0, coalesce, duty)
