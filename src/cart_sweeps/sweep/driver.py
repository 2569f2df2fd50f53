"""Run a stage against its ledger: skip what is done, resume what was cut off, retry what failed.

The whole stage is composed and validated first (one line on a config error, nothing launched). Each
run's result lands in the ledger the moment its job ends, and one run failing never stops the others.
"""

from __future__ import annotations

import shlex
import signal
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from omegaconf import DictConfig
from optuna.trial import FrozenTrial, Trial, TrialState

from cart_sweeps import interrupt
from cart_sweeps.collector import long_lived
from cart_sweeps.config import ConfigError
from cart_sweeps.options import StageKind
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.rules.rule import WHY
from cart_sweeps.stagerecord.ledger import REPEAT, Ledger, check_storage, last_number, ledger_path, writing
from cart_sweeps.stagerecord.results import LOCK, Held, Results, standing
from cart_sweeps.stagerecord.runset import OWNER, SCALE_ATTR, StageRecord, stage_ledgers
from cart_sweeps.stagerecord.standing import Standing
from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.claims import Claims
from cart_sweeps.sweep.cost import launch_set
from cart_sweeps.sweep.dataprep import prepare_for
from cart_sweeps.sweep.expand import Run, Stage
from cart_sweeps.sweep.intermediate import make_pruner, record_pruned, report_new
from cart_sweeps.sweep.objectives import objectives
from cart_sweeps.sweep.pool import JOBS, Pool, Task
from cart_sweeps.sweep.preflight import preflight
from cart_sweeps.sweep.progress import Progress
from cart_sweeps.sweep.samplers import LEARNS, make_sampler
from cart_sweeps.sweep.search_trials import SearchTrials
from cart_sweeps.text import count
from cart_sweeps.train.output import run_log

PoolFactory = Callable[[DictConfig, Path], Pool[Any]]


@dataclass
class Attempt:
    """A run to execute now; `trial` is set once it has one (a resumed run brings its own, and the steps
    it has reported as intermediate values)."""

    run: Run
    trial: Trial | None = None
    tries: int = 1
    reported: set[int] = field(default_factory=set)
    pruned: bool = False


def _attrs(run: Run) -> dict[str, Any]:
    """What the ledger keeps of a run besides its params."""
    attrs = {"run_id": run.run_id, "label": run.label, "overrides": run.overrides, "run_dir": str(run.run_dir)}
    attrs["config_id"] = run.config.config_id  # what its seeds share: the run set keeps one per table cell
    attrs[SCALE_ATTR] = run.config.cfg.scale.name  # a reading is of one scale (runset)
    return attrs | {"actual": run.actual}  # params are the paper's numbers; `actual`: those this scale changed


def put_right(run: Run, held: Held | None, occupant: RunSummary | None) -> str:
    """What a moved or occupied run waits for, and the command that puts its folder right (Standing)."""
    aside = run.run_dir.with_name(f"{run.run_dir.name}.aside")  # where a folder in the run's place goes ...
    if occupant is not None and occupant.label and occupant.run_id:  # ... unless its own run's name is free
        home = run.run_dir.with_name(f"{occupant.label}-{occupant.run_id[:8]}")
        aside = aside if home.exists() else home
    clear = shlex.join(["mv", str(run.run_dir), str(aside)])
    if held is None:
        assert occupant is not None
        return (
            f"its folder {run.run_dir} holds another run, {occupant.label} ({occupant.run_id}), so it cannot be "
            f"trained there: move that aside ({clear}); the next launch trains it"
        )
    back = shlex.join(["mv", str(held.folder), str(run.run_dir)])
    return (
        f"its result is in {held.folder}, not in its folder, so it is not trained again: put it back "
        f"({f'{clear} && ' if run.run_dir.exists() else ''}{back}); to train it again instead, move "
        f"{held.folder.name} out of {run.run_dir.parent.parent}"
    )


class StageDriver:
    """One launch of a stage: its ledger, its pool, and the queue of attempts between them."""

    @long_lived()  # its history and the runs' results last the launch
    def __init__(
        self, stage: Stage, ledger: Ledger, pool: Pool[Attempt], arguments: Sequence[str], after: int = 0
    ) -> None:
        """Read the ledger, record this launch (numbered after `after`: Ledger.record_launch), then sort each run
        by where it stands; a run's trials all carry the launch's number."""
        self.stage, self.ledger, self.pool = stage, ledger, pool
        self.sweep = stage.base.sweep
        self.objectives = objectives(self.sweep)  # the values each trial is told (one per objective)
        self.curves = len(self.objectives) == 1  # Optuna keeps no learning curve of a multi-objective trial
        self.queue: deque[Attempt] = deque()
        self.attached: list[tuple[Attempt, Any]] = []
        self.skipped = 0
        self.rule = stage.rule
        ledger.adopt_queued(self.rule.dists)
        self.history = ledger.attempts()
        self.failed_finally = 0
        self.lost: list[Run] = []
        self.recovered = 0
        self.referenced: list[tuple[Run, Held]] = []
        self.misplaced: list[tuple[Run, str]] = []  # moved or occupied: trained once its folder is put right
        self.claims = Claims(stage.sweep_dir.parent, stage.name)  # runs this launch trains: no other stage does
        self.claimed: list[Attempt] = []  # runs another stage's driver trains now: referenced once it ends
        self.results = Results()
        self.outcomes: dict[str, RunSummary] = {}  # run id -> how it ended, where known in this launch
        self.in_flight: set[str] = set()  # run ids taken to run now
        self.waiting: defaultdict[str, list[Trial]] = defaultdict(list)  # repeats of a run running now, by its id
        self.repeated = 0
        self.progress: Progress | None = None
        known = launch_set(stage, self.history, self.results)  # runs its rule added: resumed or skipped too
        self.why, self.known = dict(known.why), known.runs
        ledger.record_launch([run.run_id for run in self.known], list(arguments), after)
        for run in known.in_order:  # longest first, in the order `python -m cart_sweeps.plan` lists
            self._classify(run, self.history.get(run.run_id, []), known.held[run.run_id])
        self.search: SearchTrials | None = None
        if not stage.runs:
            repeats = ledger.repeats()
            say = lambda line: print(line, flush=True)  # noqa: E731
            self.search = SearchTrials(stage.name, stage.space, self.sweep.n_trials, self.history, repeats, say)
            self._settle(t for t in repeats if t.state == TrialState.RUNNING)

    def _classify(self, run: Run, trials: list[FrozenTrial], held: Held | None) -> None:
        """Queue, attach or skip the run by where it stands; `held`: where its result is."""
        occupant = self.results.occupants.get(run.run_id)
        where = standing(run, trials, held, occupant)
        result = held.summary if held else None
        if where == Standing.CUT_OFF:
            last = trials[-1]
            trial = self.ledger.resume(last)
            reported = set(last.intermediate_values)
            job_id = last.user_attrs.get("job_id")
            if result is not None:  # it ended after its driver did
                self.ledger.finish(trial, result, self.objectives)
                self.outcomes[run.run_id] = result
                self.skipped += 1
            elif job := (self.pool.attach(job_id) if job_id else None):
                self.attached.append((Attempt(run, trial, reported=reported), job))
                self.in_flight.add(run.run_id)
                self.claims.take(run.run_id)  # its job runs already: claimed where no other stage took it meanwhile
            else:
                self.queue.append(Attempt(run, trial, reported=reported))
        elif where == Standing.DONE:
            assert held is not None
            self.outcomes[run.run_id] = held.summary
            self.skipped += 1
        elif where in (Standing.MOVED, Standing.OCCUPIED):
            self.misplaced.append((run, put_right(run, held, occupant)))
        elif where == Standing.LOST:
            self.lost.append(run)
            self.queue.append(Attempt(run))
        elif where in (Standing.RECOVERED, Standing.REFERENCED):
            assert held is not None
            self._record_held(run, held)
            if where == Standing.REFERENCED:
                self.referenced.append((run, held))
            else:
                self.recovered += 1
            self.skipped += 1
        else:  # new, or tried before without a result: this launch tries again
            self.queue.append(Attempt(run))

    def _record_held(self, run: Run, held: Held, trial: Trial | None = None) -> None:
        """Record a result this launch did not train (its folder's, or another stage's: `owner`) as the run's
        trial: `trial`, one it started or resumed, else a new one."""
        where = {"run_dir": str(held.folder), OWNER: held.owner} if held.owner else {}
        if trial is None:
            trial = self.ledger.start(run.params, self.rule.dists(run.params), self._attrs(run) | where)
        else:
            for key, value in where.items():
                trial.set_user_attr(key, value)
        self.ledger.finish(trial, held.summary, self.objectives)

    def _attrs(self, run: Run) -> dict[str, Any]:
        """A trial's attributes: who the run is, and why it exists where the stage's seed rule added it (a run
        another stage trained too: the seed is this stage's own, referenced)."""
        why = self.why.get(run.run_id)
        return _attrs(run) | ({WHY: why} if why else {})

    def _sampled_attempt(self) -> Attempt | None:
        """A new search trial's run. A trial whose params are a run the ledger holds is a repeat: it takes that run's
        result, now or when the run (running now) ends, and trains nothing (sweep/search_trials.py). None: nothing
        to ask now (the search ended, or a repeat waits: the sampler hears how that run ends first)."""
        search = self.search
        while search is not None and not any(self.waiting.values()) and search.may_ask():
            trial = self.ledger.ask()
            params = self.stage.space.sample(trial)
            run = self.stage.run(params)
            repeat = run.run_id in self.history
            search.sampled(params, repeat)
            if not repeat:
                self.ledger.tag(trial, _attrs(run))
                self.ledger.add_to_launch(run.run_id)
                self.history[run.run_id] = []
                return Attempt(run, trial)
            self.repeated += 1
            self.ledger.tag(trial, {REPEAT: run.run_id, "label": run.label, "run_dir": str(run.run_dir)})
            if self._open(run.run_id):
                self.waiting[run.run_id].append(trial)
            else:
                self.ledger.finish(trial, self._outcome(run.run_id, run.label), self.objectives)
        return None

    def _open(self, run_id: str) -> bool:
        """Whether the run is to run in this launch: queued, running now, or waited for (another stage trains it)."""
        return run_id in self.in_flight or any(a.run.run_id == run_id for a in (*self.queue, *self.claimed))

    def _outcome(self, run_id: str, label: str) -> RunSummary:
        """How a run ended, for a repeat of it; a run this launch does not run (its folder to put right) failed."""
        return self.outcomes.get(run_id) or RunSummary(
            RunStatus.FAILED, error=f"its run {label} ({run_id}) has no result in this launch"
        )

    def _settle(self, repeats: Iterable[FrozenTrial]) -> None:
        """Repeats a dead driver left running: each waits for its run where this launch runs it, else takes how it
        ended."""
        for left in repeats:
            run_id, trial = left.user_attrs[REPEAT], self.ledger.resume(left)
            if self._open(run_id):
                self.waiting[run_id].append(trial)
            else:
                self.ledger.finish(trial, self._outcome(run_id, left.user_attrs.get("label", run_id)), self.objectives)

    def _ended(self, run_id: str, summary: RunSummary) -> None:
        """A run ended for good in this launch: the repeats waiting for it take its result."""
        self.outcomes[run_id] = summary
        for trial in self.waiting.pop(run_id, []):
            self.ledger.finish(trial, summary, self.objectives)

    def take(self, n: int) -> list[Attempt]:
        """Up to `n` runs to start now, each claimed (sweep/claims.py); with nothing running and only runs another
        stage trains left, it waits for one of them to end."""
        interrupt.raise_if_received()  # a SIGINT/SIGTERM the collector swallowed
        self._settle_claimed()
        out: list[Attempt] = []
        while len(out) < n:
            idle = not out and n >= self.pool.capacity  # nothing running
            if not self.queue and idle and not self.claimed:  # a round's results are in
                self._add_round()
            attempt = self.queue.popleft() if self.queue else self._sampled_attempt()
            if attempt is None:
                if not (idle and self.claimed):
                    break
                self._wait_for_claimed()
                continue
            if not self._claim(attempt):
                continue
            self.in_flight.add(attempt.run.run_id)
            if attempt.trial is None:
                run = attempt.run
                attempt.trial = self.ledger.start(run.params, self.rule.dists(run.params), self._attrs(run))
            out.append(attempt)
        return out

    def _claim(self, attempt: Attempt) -> bool:
        """Whether this launch trains the run now, claimed (sweep/claims.py); else another stage's driver trains it
        now (waited for), or trained it since this launch began (referenced)."""
        run = attempt.run
        if (holder := self.claims.take(run.run_id)) is not None:
            self.claimed.append(attempt)
            print(
                f"stage {self.stage.name}: {run.label}: {holder} trains it now, waiting for its result "
                "(referenced, not trained again)",
                flush=True,
            )
            return False
        if run.run_id not in self.claims.reclaimed or (held := self.results.trained_since(run)) is None:
            return True
        self.claims.release(run.run_id)
        self._record_held(run, held, attempt.trial)
        self.skipped += 1
        self._ended(run.run_id, held.summary)
        print(
            f"stage {self.stage.name}: {run.label}: done in stage {held.owner}, referenced, not trained again "
            f"({held.folder})",
            flush=True,
        )
        return False

    def _settle_claimed(self) -> None:
        """Runs another stage's driver trained whose claim is free now: queued first, so `take` claims each and
        references what that stage left (it may have failed, or its driver died: then it trains here)."""
        for attempt in list(self.claimed):
            if self.claims.take(attempt.run.run_id) is None:
                self.claimed.remove(attempt)
                self.queue.appendleft(attempt)

    def _wait_for_claimed(self) -> None:
        """Nothing runs here: wait until a run another stage trains ends (or its driver dies)."""
        waiting = len(self.claimed)
        while len(self.claimed) == waiting:
            time.sleep(self.pool.poll_s)
            interrupt.raise_if_received()
            self._settle_claimed()

    def _add_round(self) -> None:
        """Queue the runs the stage's rule adds now (cart_sweeps.rules), each with why; none after a run failed for
        good (its cell would stay short of the round's seed). A round whose runs are all done already (another
        stage's, referenced: a copy of a stage in its root) is in at once, so the next is asked for."""
        if self.failed_finally:
            return
        say = lambda line: print(line, flush=True)  # noqa: E731
        while True:
            added = [a for a in self.rule.next_round(self.ledger, say) if a.run.run_id not in self.why]
            skipped = self.skipped
            for a in added:
                print(f"stage {self.stage.name}: {a.run.label}: {a.why}", flush=True)
                self.why[a.run.run_id] = a.why
                self.ledger.add_to_launch(a.run.run_id)
                trials = self.history.get(a.run.run_id, [])
                self._classify(a.run, trials, self.results.held(a.run, trials))
            if not added or self.skipped - skipped < len(added):
                return

    def task(self, attempt: Attempt) -> Task:
        """The run's config, composed now (the driver keeps none) with the pool's settings (threads)."""
        extra = [o for o in self.pool.extra_overrides() if o.split("=")[0] not in self.stage.args.passed]
        run = attempt.run
        at_launch = self.rule.launch_overrides(run)  # a ladder's branch: set as it launches (rules/ladder.py)
        return Task(self.stage.compose(run.overrides + at_launch + extra), str(run.run_dir), run.run_id)

    def on_start(self, attempt: Attempt, job_id: str) -> None:
        assert attempt.trial is not None
        attempt.trial.set_user_attr("job_id", job_id)
        assert self.progress is not None
        self.progress.started()

    def on_poll(self, attempt: Attempt) -> bool:
        """Report the run's new evaluations to its trial; True when the pruner stops it now."""
        assert attempt.trial is not None
        if not self.curves:
            return False
        new = report_new(attempt.trial, attempt.run.run_dir, self.sweep.metric, attempt.reported)
        attempt.pruned = attempt.pruned or (new and attempt.trial.should_prune())
        return attempt.pruned

    def on_done(self, attempt: Attempt, summary: RunSummary) -> None:
        assert attempt.trial is not None and self.progress is not None
        if self.curves:
            report_new(attempt.trial, attempt.run.run_dir, self.sweep.metric, attempt.reported)
        if attempt.pruned and not summary.is_result:
            record_pruned(attempt.run.run_dir)
            summary.status, summary.error = RunStatus.PRUNED, None
        status = self.ledger.finish(attempt.trial, summary, self.objectives)
        retry = status.retry_now and attempt.tries <= self.sweep.max_retries
        self.in_flight.discard(attempt.run.run_id)
        if retry:  # queued before the progress line, which counts it as left
            self.queue.appendleft(Attempt(attempt.run, tries=attempt.tries + 1))
        else:
            self.claims.release(attempt.run.run_id)
            self._ended(attempt.run.run_id, summary)
        self.progress.finished(attempt.run.label, status, summary, not retry, run_log(attempt.run.run_dir))
        if not retry and not status.is_result:
            self.failed_finally += 1

    def on_refused(self, attempt: Attempt, error: str) -> None:
        """The scheduler refused the run's job: its trial ends rejected, so no relaunch takes it as cut off."""
        assert attempt.trial is not None
        refused = RunSummary(RunStatus.REJECTED, error=error)
        self.ledger.finish(attempt.trial, refused, self.objectives)
        self.in_flight.discard(attempt.run.run_id)
        self.claims.release(attempt.run.run_id)
        self._ended(attempt.run.run_id, refused)

    def left(self) -> int:
        """Runs still to start: those queued or waited for, and the new runs a search may still sample (a repeat
        trains none)."""
        return len(self.queue) + len(self.claimed) + (self.search.new_runs_left() if self.search else 0)

    def recipes(self) -> list[DictConfig]:
        """The data recipes the runs left read: the stage's own, unless a grid axis varies it (one per
        configuration then; a 100,000-run stage has 64)."""
        if not any(key.split(".")[0] == "data" for key in self.stage.varied):
            return [self.stage.base.data]
        return list({a.run.config.config_id: a.run.config.cfg.data for a in self.queue}.values())

    def launch(self) -> int:
        """Run everything left; the exit code: 0, 1 when a run failed, 130 when interrupted."""
        s = self.stage
        size = count(len(self.known), "run") if s.runs else f"sweep.n_trials={self.sweep.n_trials}, "
        size += "" if s.runs else f"{count(len(self.known), 'run')} sampled so far"
        lines = [
            f"{size}; {self.skipped} done, skipped; {len(self.attached)} still queued or running; "
            f"{sum(a.trial is not None for a in self.queue)} cut off, resumed; -> {s.sweep_dir}"
        ]
        lines += [screened.line() for screened in s.screened]  # stage.select=zoom: why its candidates
        if self.recovered:
            lines.append(f"{count(self.recovered, 'result')} recorded in the ledger from their run folders")
        if self.referenced:
            run, held = self.referenced[0]
            more = f" and {len(self.referenced) - 1} more" if len(self.referenced) > 1 else ""
            lines.append(
                f"{count(len(self.referenced), 'run')} done in another stage, referenced, not trained again: "
                f"{run.label} ({held.folder}){more}"
            )
        if self.lost:
            lines.append(
                f"{count(len(self.lost), 'run')} the ledger holds as done lost their run folder (first: "
                f"{self.lost[0].run_dir}); running them again"
            )
        if self.misplaced:
            (run, fix), rest = self.misplaced[0], len(self.misplaced) - 1
            others = f" ({count(rest, 'more run')} so: python -m cart_sweeps.plan lists them)" if rest else ""
            lines.append(f"{run.label}: {fix}{others}")
        for line in lines:
            print(f"stage {s.name}: {line}", flush=True)
        if self.left() and StageKind.of(s.base).trains:  # before the ETA's clock starts; an evaluation reads its
            prepare_for(s.name, self.recipes())  # source's data, which that source's training prepared
        interrupted = False
        with Progress(s.name, self.left() + len(self.attached), self.sweep.metric, left=self.left) as self.progress:
            for _ in self.attached:
                self.progress.started()
            try:
                self.pool.run(
                    self.take,
                    self.task,
                    self.on_start,
                    self.on_done,
                    self.attached,
                    on_refused=self.on_refused,
                    on_wait=self.progress.waiting,
                    on_poll=self.on_poll,
                )
            except KeyboardInterrupt:
                interrupted = True
            finally:
                self.claims.release_all()
            where = ledger_path(s.sweep_dir, self.sweep.storage) or self.sweep.storage
            self.progress.close(self.skipped, str(where), interrupted)
        if self.repeated:
            print(
                f"stage {s.name}: {count(self.repeated, 'trial')} sampled a run the ledger held and took its result "
                f"(a repeat: user attr {REPEAT}); no run was trained twice",
                flush=True,
            )
        return 130 if interrupted else int(self.failed_finally > 0 or bool(self.misplaced))


def run_stage(arguments: Sequence[str], make_pool: PoolFactory) -> int:
    """Validate the stage, take its driver lock, launch what is left; returns the exit code."""
    stage = Stage(arguments)
    pruner = make_pruner(stage.base.sweep, stage.name, search=not stage.runs)
    sweep = stage.base.sweep
    if not stage.runs and sweep.sampler in LEARNS and sweep.n_trials <= sweep.startup_trials:
        print(
            f"stage {stage.name}: sweep.n_trials={sweep.n_trials} <= sweep.startup_trials={sweep.startup_trials}, "
            f"so sweep.sampler={sweep.sampler} samples every trial at random; run more trials or lower "
            "sweep.startup_trials",
            flush=True,
        )
    preflight(stage)
    stage.sweep_dir.mkdir(parents=True, exist_ok=True)
    pool = make_pool(stage.base, stage.sweep_dir / JOBS)
    lock = FileLock(stage.sweep_dir / LOCK)
    try:
        lock.acquire(timeout=0)
    except Timeout as err:
        raise ConfigError(f"stage {stage.name} is already being run by another driver ({lock.lock_file})") from err
    previous = interrupt.install(signal.SIGTERM, signal.SIGINT)
    try:
        recorded = StageRecord.read(stage.sweep_dir)  # the previous launch's: the storage it named
        if recorded is None:  # a stage launched here for the first time has runs to train: its workers start now
            pool.warm(len(stage.runs) if stage.runs else sweep.n_trials)
        sampler = make_sampler(sweep.sampler, stage.seed(), sweep.startup_trials)  # sweep/samplers.py
        with writing(ledger_path(stage.sweep_dir, sweep.storage)):
            ledger = Ledger.open(stage.sweep_dir, stage.name, sweep.storage, sampler, pruner, stage.objective())
            if ledger.study.study_name != stage.name and not ledger.study.trials:
                print(
                    f"stage {stage.name}: this launch ranks by {', '.join(objectives(sweep))} with its recipe as "
                    f"given, which its ledger's earlier study does not; it records in a study of its own "
                    f"({ledger.study.study_name}), beside it",
                    flush=True,
                )
            ledger.name_objective(objectives(sweep))
            storage = check_storage(sweep.storage, stage.sweep_dir.parent)  # absolute: readers start elsewhere
            StageRecord(
                stage.name,
                stage.spec.role,
                storage,
                sweep.metric,
                list(stage.varied),
                search=not stage.runs,
                looks=stage.rule.recorded_looks(),
                equivalence=stage.spec.equivalence,
                grid_seeds=stage.rule.spending_from(),
                scale=stage.base.scale.name,
                metrics=objectives(sweep) if len(objectives(sweep)) > 1 else [],
                promoted=[screened.record() for screened in stage.screened],
            ).write(stage.sweep_dir)
            after = last_number(stage_ledgers(stage.sweep_dir, stage.name, recorded, skip=storage)[0])  # other files
            return StageDriver(stage, ledger, pool, arguments, after).launch()
    except KeyboardInterrupt:  # a signal before the launch's own handling (its ledger opening, its runs sorted)
        print(f"stage {stage.name}: interrupted before its first run; a relaunch starts it", flush=True)
        return 130
    finally:
        pool.close()  # its workers, warmed, end with the launch, whatever ended it (launch's pool.run closes it too)
        interrupt.restore(previous)
        lock.release()
