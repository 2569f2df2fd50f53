"""One test per adapter of cart_sweeps.adapters (the one door to third-party internals): each fails naming the adapter
and the installed release of the package whose private API it relies on, when an upgrade removes the API, changes its
signature or its behaviour. tests/pins/check.sh runs this file on the lowest and highest releases pyproject.toml
allows; it needs neither torch nor tests/conftest.py (`--noconftest`).
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

import optuna
import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from cart_sweeps.adapters import hydra as hydra_adapters
from cart_sweeps.adapters import optuna as optuna_adapters
from cart_sweeps.adapters import submitit as submitit_adapters
from cart_sweeps.adapters.omegaconf import cache_interpolation_parses


def broken(adapter: str, package: str, what: str) -> str:
    """The failure's message: which adapter, on which release of which package, and what no longer holds."""
    return f"cart_sweeps.adapters.{adapter} on {package} {version(package)}: {what}"


def test_omegaconf_cache_interpolation_parses() -> None:
    import omegaconf.base

    cfg = OmegaConf.create({"a": 3, "b": "${a}", "c": "x${a}y"})
    plain = OmegaConf.to_container(cfg, resolve=True)
    cache_interpolation_parses()
    cache_interpolation_parses()  # twice in a process wraps once
    cached = omegaconf.base.parse
    says = broken("omegaconf.cache_interpolation_parses", "omegaconf", "resolving no longer goes through base.parse")
    assert hasattr(cached, "cache_info") and not hasattr(cached.__wrapped__, "cache_info"), says
    before = cached.cache_info().hits
    assert OmegaConf.to_container(OmegaConf.create({"a": 3, "b": "${a}", "c": "x${a}y"}), resolve=True) == plain, says
    assert OmegaConf.to_container(cfg, resolve=True) == plain, says
    assert cached.cache_info().hits > before, says


def test_hydra_args_parser() -> None:
    line = ["-cd", "mine", "a=1", "--cfg", "job", "-p", "model", "b=2", "--resolve", "-cn", "other", "-m"]
    try:
        ns = hydra_adapters.hydra_args_parser().parse_intermixed_args(line)
        read = (ns.config_dir, ns.config_name, ns.cfg, ns.package, ns.resolve, ns.multirun, ns.overrides)
        flags = (ns.help, ns.hydra_help, ns.info, ns.shell_completion, ns.config_path, ns.run)
    except (AttributeError, SystemExit) as err:
        raise AssertionError(broken("hydra.hydra_args_parser", "hydra-core", f"a flag changed: {err!r}")) from err
    assert read == ("mine", "other", "job", "model", True, True, ["a=1", "b=2"]), broken(
        "hydra.hydra_args_parser", "hydra-core", f"reads {read}"
    )
    says = broken("hydra.hydra_args_parser", "hydra-core", f"{flags}")
    assert flags == (False, False, None, False, None, False), says


def test_hydra_apply_overrides() -> None:
    cfg = OmegaConf.create({"a": 1, "b": {"c": 2, "d": 3}, "e": [1]})
    OmegaConf.set_struct(cfg, True)
    lines = ["a=5", "+b.x=4", "~b.d", "++f=6", "e=[1,'two']", "b.c=${a}"]
    try:
        hydra_adapters.apply_overrides(OverridesParser.create().parse_overrides(lines), cfg)
    except AttributeError as err:
        raise AssertionError(broken("hydra.apply_overrides", "hydra-core", f"gone: {err}")) from err
    got = OmegaConf.to_container(cfg, resolve=True)
    expected = {"a": 5, "b": {"c": 5, "x": 4}, "e": [1, "two"], "f": 6}
    assert got == expected, broken("hydra.apply_overrides", "hydra-core", f"{lines} gave {got}")
    with pytest.raises(HydraException, match=r"Could not override 'b\.y'"):  # compose.py reads this wording
        hydra_adapters.apply_overrides(OverridesParser.create().parse_overrides(["b.y=1"]), cfg)


def test_hydra_run_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A plain run composes once, runs the task in hydra.run.dir with .hydra/ written; --cfg is Hydra's own."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "app.yaml").write_text(f"x: 1\ny: two\nhydra:\n  run:\n    dir: {tmp_path / 'out'}\n")
    monkeypatch.chdir(tmp_path)
    seen: list[tuple[DictConfig, str]] = []

    def task(cfg: DictConfig) -> None:
        seen.append((cfg, HydraConfig.get().runtime.output_dir))

    parses: list[int] = []
    grammar = OverridesParser.parse_overrides

    def counted(self: OverridesParser, overrides: list[str]) -> object:
        parses.append(1)
        return grammar(self, overrides)

    monkeypatch.setattr(OverridesParser, "parse_overrides", counted)
    parser = hydra_adapters.hydra_args_parser()
    says = broken("hydra.run_app", "hydra-core", "")
    try:
        hydra_adapters.run_app(parser.parse_args(["x=5"]), task, str(conf), "app")
    except (ImportError, AttributeError, TypeError) as err:
        raise AssertionError(f"{says}{err!r}") from err
    assert [(OmegaConf.to_container(cfg), out) for cfg, out in seen] == [({"x": 5, "y": "two"}, str(tmp_path / "out"))]
    assert (tmp_path / "out" / ".hydra" / "overrides.yaml").read_text() == "- x=5\n", says + ".hydra/ as before"
    assert "mode: RUN" in (tmp_path / "out" / ".hydra" / "hydra.yaml").read_text(), says + "hydra.mode as before"
    assert len(parses) == 1, f"{says}a plain run composed {len(parses)} times (once expected)"
    capsys.readouterr()
    hydra_adapters.run_app(parser.parse_args(["--cfg", "job", "x=7"]), task, str(conf), "app")
    assert "x: 7\n" in capsys.readouterr().out, says + "--cfg job prints otherwise"
    assert len(seen) == 1


def test_optuna_tables() -> None:
    t = optuna_adapters.optuna_tables
    columns = {
        "TrialModel": {"trial_id", "number", "study_id", "state", "datetime_start", "datetime_complete"},
        "TrialParamModel": {"trial_id", "param_name", "param_value", "distribution_json"},
        "TrialValueModel": {"trial_id", "objective", "value", "value_type"},
        "TrialIntermediateValueModel": {"trial_id", "step", "intermediate_value", "intermediate_value_type"},
        "TrialUserAttributeModel": {"trial_id", "key", "value_json"},
        "TrialSystemAttributeModel": {"trial_id", "key", "value_json"},
        "StudyModel": {"study_id", "study_name"},
        "StudyUserAttributeModel": {"study_id", "key", "value_json"},
    }
    for model, wanted in columns.items():
        table = getattr(t, model, None)
        have = set(table.__table__.c.keys()) if table is not None else set()
        assert wanted <= have, broken("optuna.optuna_tables", "optuna", f"{model} lacks {sorted(wanted - have)}")
    readers = (t.TrialValueModel.stored_repr_to_value, t.TrialIntermediateValueModel.stored_repr_to_intermediate_value)
    kinds = (t.TrialValueModel.TrialValueType.FINITE, t.TrialIntermediateValueModel.TrialIntermediateValueType.FINITE)
    for read, kind in zip(readers, kinds, strict=True):
        assert read(1.5, kind) == 1.5, broken("optuna.optuna_tables", "optuna", f"{read.__qualname__} reads otherwise")


def _studies(tmp_path: Path) -> tuple[optuna.Study, RDBStorage]:
    storage = RDBStorage(f"sqlite:///{tmp_path / 'ledger.db'}")
    return optuna.create_study(storage=storage, study_name="s"), storage


def test_optuna_study_storage_and_database_of(tmp_path: Path) -> None:
    study, storage = _studies(tmp_path)
    journal = optuna.create_study(storage=JournalStorage(JournalFileBackend(str(tmp_path / "j.log"))))
    says = broken("optuna.study_storage/database_of", "optuna", "")
    assert optuna_adapters.database_of(study) is storage, says + "the database is not found behind the study"
    assert optuna_adapters.database_of(journal) is None, says + "a journal reads as a database"
    study.ask()
    trial_id = optuna_adapters.study_storage(study).create_new_trial(storage.get_study_id_from_name("s"))
    assert [t.number for t in study.get_trials()] == [0, 1], says + f"a new trial ({trial_id}) is not the study's"


def test_optuna_transaction(tmp_path: Path) -> None:
    study, storage = _studies(tmp_path)
    attr = optuna_adapters.optuna_tables.StudyUserAttributeModel
    study_id = storage.get_study_id_from_name("s")
    with pytest.raises(RuntimeError), optuna_adapters.transaction(storage) as session:
        session.add(attr(study_id=study_id, key="lost", value_json="1"))
        raise RuntimeError
    with optuna_adapters.transaction(storage) as session:
        session.add(attr(study_id=study_id, key="kept", value_json="2"))
    got = storage.get_study_user_attrs(study_id)
    assert got == {"kept": 2}, broken("optuna.transaction", "optuna", f"rollback/commit differ: {got}")


@pytest.mark.parametrize("state", [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL])
def test_optuna_end_trial(tmp_path: Path, state: TrialState) -> None:
    """end_trial writes what the public calls write (set_user_attr each, then tell), in one transaction."""
    study, storage = _studies(tmp_path)
    public = optuna.create_study(storage=storage, study_name="public")
    attrs = {"status": "done", "results": {"ppl": 1.5}}
    for s in (study, public):
        trial = s.ask()
        trial.report(2.5, step=3)
    values = [1.25] if state == TrialState.COMPLETE else None
    try:
        optuna_adapters.end_trial(storage, storage.get_study_id_from_name("s"), 0, state, values, attrs)
    except (AttributeError, TypeError) as err:
        raise AssertionError(broken("optuna.end_trial", "optuna", f"a private writer changed: {err!r}")) from err
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    public.tell(trial, values[0] if values else None, state=state)

    def written(s: optuna.Study) -> tuple[object, ...]:
        (t,) = s.get_trials()
        return t.state, t.values, t.user_attrs, t.intermediate_values, t.datetime_complete is not None

    assert written(study) == written(public), broken("optuna.end_trial", "optuna", "writes otherwise than tell")


def test_submitit_local_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller starts the tasks of the job in its folder, waits for their exit codes, and kills none left."""
    env = {
        "SUBMITIT_LOCAL_NTASKS": "2",
        "SUBMITIT_LOCAL_COMMAND": f"{sys.executable} -c 'import sys; sys.exit(3)'",
        "SUBMITIT_LOCAL_TIMEOUT_S": "60",
        "SUBMITIT_LOCAL_SIGNAL_DELAY_S": "1",
        "SUBMITIT_STDERR_TO_STDOUT": "",
        "SUBMITIT_LOCAL_WITH_SHELL": "",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
        "SUBMITIT_LOCAL_GPUS": "",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    says = broken("submitit.local_controller", "submitit", "")
    try:
        controller = submitit_adapters.local_controller(tmp_path)
        controller.start_tasks()
        codes, tasks = list(controller.wait()), len(controller.tasks)
        controller.kill_tasks()
    except (AttributeError, KeyError, TypeError) as err:
        raise AssertionError(f"{says}{err!r}") from err
    assert codes == [3, 3], f"{says}exit codes {codes}"
    assert controller.pid == str(os.getpid()) and tasks == 2, f"{says}pid/tasks differ"
    assert isinstance(submitit_adapters.LOCAL_REQUEUE_RETURN_CODE, int), f"{says}no requeue code"


def test_submitit_session_executor(tmp_path: Path) -> None:
    """A job submitted through the overridden `_submit_command` runs to its result under submitit's own controller
    module (which builds the Controller from the environment set there)."""

    class Executor(submitit_adapters.SessionExecutor):
        def controller(self) -> tuple[list[str], dict[str, str]]:
            return [sys.executable, "-m", "submitit.local._local", str(self.folder)], {"MARK": "1"}

    executor = Executor(tmp_path)
    executor.update_parameters(timeout_min=1)
    says = broken("submitit.SessionExecutor", "submitit", "")
    try:
        job = executor.submit(os.getenv, "MARK")
        got = job.result()
    except Exception as err:
        raise AssertionError(f"{says}{err!r}") from err
    assert got == "1", f"{says}the job saw MARK={got!r}"
    assert job.job_id.isdigit(), f"{says}job id {job.job_id!r} is no controller pid"


def test_hydra_apply_overrides_composes_as_hydra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The composer (a cached base, then apply_overrides) gives exactly Hydra's composition of the real conf/."""
    from cart_sweeps.compose import compose_config
    from cart_sweeps.composer import Composer

    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path))
    composer = Composer()
    for loops, lr in [(2, 0.1), (3, 0.2), (3, 0.2)]:  # the third reuses what the first two share
        args = ["stage=1", "scale=tiny", f"model.n_loops={loops}", f"++scale.paper={{trainer.lr:{lr}}}", "seed=7"]
        mine, hydras = OmegaConf.to_yaml(composer(args)), OmegaConf.to_yaml(compose_config(args))
        assert mine == hydras, broken("hydra.apply_overrides", "hydra-core", f"composes {args} otherwise than Hydra")
