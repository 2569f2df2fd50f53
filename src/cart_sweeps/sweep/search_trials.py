"""A search's trials as its driver asks for them, and when it stops asking.

A trial is a new run or a repeat (a run the ledger holds, which the trial takes its result from): both count
toward sweep.n_trials, as Optuna counts every trial. A search stops asking at sweep.n_trials; once every point of
a finite space (integers, choices, conditions, a float range of one value) has been sampled, where asking again
could only repeat; and after `MAX_REPEATS` trials in a row that each repeated a run (a sampler settled on what it
has: Optuna has no end of its own there). Each early end is one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from optuna.trial import FrozenTrial

from cart_sweeps.sweep.space import Space, point

MAX_REPEATS = 50  # trials in a row that repeat a run: the search ends (a relaunch asks again)


class SearchTrials:
    """The trials a search has so far (in its ledger), the points of its space they sampled, and whether to ask."""

    def __init__(
        self,
        stage: str,
        space: Space,
        n_trials: int,
        history: Mapping[str, Sequence[FrozenTrial]],
        repeats: Sequence[FrozenTrial],
        say: Callable[[str], None],
    ) -> None:
        self.stage, self.space, self.n_trials, self.say = stage, space, n_trials, say
        self.size = space.size()
        self.trials = len(history) + len(repeats)
        self.points: set[Any] = set()
        for params in [t[0].params for t in history.values() if t] + [t.params for t in repeats]:
            self._saw(params)
        self.in_a_row = 0
        self.ended = False

    def _saw(self, params: Mapping[str, Any]) -> None:
        if self.space.holds(params):  # a trial of a launch with another space is no point of this one
            self.points.add(point(params))

    def sampled(self, params: Mapping[str, Any], repeat: bool) -> None:
        """A trial was asked: a new run, or a `repeat` of one."""
        self.trials += 1
        self._saw(params)
        self.in_a_row = self.in_a_row + 1 if repeat else 0

    def may_ask(self) -> bool:
        """Whether to ask for another trial; an early end is said once."""
        if self.ended or self.trials >= self.n_trials:
            return False
        if self.size is not None and len(self.points) >= self.size:
            self.say(
                f"stage {self.stage}: every one of its search space's {self.size} points has been sampled, so the "
                f"search ends at {self.trials} of sweep.n_trials={self.n_trials} trials (another trial could only "
                "repeat a run)"
            )
            self.ended = True
        elif self.in_a_row >= MAX_REPEATS:
            self.say(
                f"stage {self.stage}: the sampler repeated runs the ledger holds for {self.in_a_row} trials in a row, "
                f"so the search ends at {self.trials} of sweep.n_trials={self.n_trials} trials (a relaunch asks again)"
            )
            self.ended = True
        return not self.ended

    def new_runs_left(self) -> int:
        """At most how many new runs the search may still sample."""
        if self.ended:
            return 0
        left = max(0, self.n_trials - self.trials)
        return left if self.size is None else min(left, max(0, self.size - len(self.points)))
