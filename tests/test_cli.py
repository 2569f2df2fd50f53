"""The user's own command, as a Hydra/Optuna user types it: a stage named without -m, Hydra's flags,
their own config folder, the numbers a run really has, and what a run shows and keeps of its output."""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState
from stages import env, trials, user_stage, with_fault

from cart_sweeps.compose import CONFIG_NAME_ENV, SEARCHPATH_ENV, compose_config, parse_overrides, use_config_sources
from cart_sweeps.config import ConfigError
from cart_sweeps.sweep.expand import Stage
from cart_sweeps.train.output import output_to_run_log
from cart_sweeps.train.progress import RunProgress

MY_STAGE = {"name": "mine", "grid": {"model.n_loops": [2, 3]}, "recipe": {"seed": 7, "model.d_model": 256}}


@pytest.fixture(scope="module")
def user_configs(tmp_path_factory) -> Path:
    """A user's config folder outside the repo: a stage of their own and a model preset."""
    folder = tmp_path_factory.mktemp("my-configs")
    (folder / "stage").mkdir()
    (folder / "model").mkdir()
    (folder / "stage" / "mine.yaml").write_text(yaml.safe_dump(MY_STAGE))
    (folder / "model" / "mycart.yaml").write_text("defaults:\n  - cart\ninit_std: 0.03\n")
    (folder / "myconfig.yaml").write_text("defaults:\n  - config\n  - _self_\nseed: 5\n")
    return folder


def cli(module: str, *args: str, runs: Path, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, env=env(runs, **extra), capture_output=True, text=True, timeout=timeout, cwd=runs)


@pytest.mark.slow
def test_a_named_stage_runs_its_grid_without_m(tmp_path, user_configs, data_cache):
    """No -m: the narrowed Stage-1 grid runs, through the user's model preset (found by every job), with
    each run's output in its folder; the failing run's is named in the stage's line."""
    grid = ["stage=1", "scale=tiny", "model=mycart", "model.d_model=32", "model.n_loops=2,4", "model.n_prelude=2"]
    args = ["--config-dir", str(user_configs), *grid, "trainer.steps=3", "sweep.max_retries=0"]
    fault = with_fault(tmp_path, "step:raise:2:-R4-", tmp_path / "mark")
    proc = subprocess.run(
        [sys.executable, "-m", "cart_sweeps", *args, "launcher.slots=2", "launcher.poll_s=0.2"],
        env=fault,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    done = {t.params["model.n_loops"]: t for t in trials(tmp_path)}
    assert sorted(done) == [2, 4] and done[2].state == TrialState.COMPLETE and done[4].state == TrialState.FAIL
    assert done[2].params["model.d_model"] == 256 and done[2].user_attrs["actual"] == {"model.d_model": 32}
    run_dir = Path(done[2].user_attrs["run_dir"])
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["model"]["init_std"] == 0.03 and saved["model"]["d_model"] == 32
    assert saved["scale"]["paper"]["model.d_model"] == 256 and saved["scale"]["paper"]["trainer.seq_len"] == 512
    assert "d32-P2-R2-s42: step 1/3 loss" in (run_dir / "run.log").read_text()
    failed_log = Path(done[4].user_attrs["run_dir"]) / "run.log"
    assert "Traceback" in failed_log.read_text() and "injected fault" in failed_log.read_text()
    assert "d32-P2-R4-s42: failed" in proc.stderr and f"(output: {failed_log})" in proc.stderr


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_plan_and_cfg_take_the_users_config_folder(tmp_path, user_configs):
    out = cli("cart_sweeps.plan", "--config-dir", str(user_configs), "stage=mine", "scale=tiny", runs=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "d32-P2-R2-s7" in out.stdout and "d32-P2-R3-s7" in out.stdout
    assert "scale=tiny maps the paper's numbers: " in out.stdout and "model.d_model 256 -> 32" in out.stdout
    shown = cli(
        "cart_sweeps", "stage=mine", "scale=tiny", "--config-dir", str(user_configs), "--cfg", "job", runs=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    assert "# its 2 runs" in shown.stdout and "d32-P2-R3-s7-" in shown.stdout and "cart_sweeps.plan" in shown.stdout


def test_hydra_searchpath_reaches_every_composition(monkeypatch, user_configs):
    monkeypatch.setenv(SEARCHPATH_ENV, "[]")  # restored after the test
    searchpath = f"hydra.searchpath=[file://{user_configs}]"
    use_config_sources(None, None, parse_overrides([searchpath]))
    runs = Stage([searchpath, "stage=mine", "model=mycart"]).runs
    assert [(r.label, r.config.cfg.model.init_std) for r in runs] == [("d256-P6-R2-s7", 0.03), ("d256-P6-R3-s7", 0.03)]


def test_a_primary_config_of_ones_own(monkeypatch, user_configs):
    """--config-dir DIR --config-name myconfig, as every composition of the command (plan's, a job's) sees it."""
    monkeypatch.setenv(SEARCHPATH_ENV, "[]")
    monkeypatch.setenv(CONFIG_NAME_ENV, "config")
    use_config_sources(str(user_configs), "myconfig", [])
    assert compose_config(["scale=tiny"]).seed == 5


def test_a_config_folder_that_is_not_there_is_one_line(tmp_path):
    proc = cli("cart_sweeps", "--config-dir", "/no/such/folder", "stage=1", runs=tmp_path)
    assert proc.returncode == 2 and proc.stderr == "error: --config-dir /no/such/folder: no such folder\n"


@pytest.mark.parametrize(
    ("sweep", "says"),
    [
        ("trainer.lr=interval(1e-4,1e-3)", "an interval is a search range"),
        ("model.n_loops=glob(*)", "glob() picks config group options"),
        ("model.d_model=32,100", "nor one of their widths at scale=tiny (32, 48, 64, 96)"),
    ],
)
def test_sweep_syntax_a_stage_cannot_take_is_one_line(sweep, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        Stage(["stage=1", "scale=tiny", sweep])


def test_a_setting_the_schema_lacks_is_one_line():
    """`+` adds keys past a schema: a misspelt setting was a KeyError deep in the run id."""
    with pytest.raises(ConfigError, match=re.escape("+trainer.warmup: trainer has no such setting")):
        Stage(["stage=1", "scale=tiny", "+trainer.warmup=5"])


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize("scale", ["tiny", "paper"])
def test_every_shipped_stage_validates_at_either_scale(scale):
    """The value checks (finite bounds, min_lr <= lr, a warm-up shorter than the run, betas) refuse no run of a
    shipped training stage: the tiny scale's shrunk warm-ups (100 -> 1 at 20 steps) included, and the ends of the
    lr search, whose lowest peak is scale=tiny's trainer.min_lr."""
    for args in (["stage=1"], ["stage=2"], ["stage=parity"], ["stage=ablations"], ["stage=1", "stage.replicates=2"]):
        assert Stage([*args, f"scale={scale}"]).runs
    Stage(["stage=lr", f"scale={scale}", "sweep.sampler=tpe", "sweep.n_trials=2"])
    assert Stage(["stage=1", f"scale={scale}", "model.n_loops=2", "trainer.grad_clip=inf"]).runs  # no clipping


def test_an_unset_environment_variable_is_one_line(tmp_path):
    """An unset ${oc.env:X} in an override was a 115-line traceback; the driver's case: test_integrity_stage.py."""
    unset = "CART_SWEEPS_TEST_UNSET"
    done = cli("cart_sweeps.plan", "stage=1", "scale=tiny", f"trainer.lr=${{oc.env:{unset}}}", runs=tmp_path)
    assert (done.returncode, done.stderr) == (
        2,
        f"error: trainer.lr: the environment variable {unset} is not set (set it, or give a default: "
        f"${{oc.env:{unset},VALUE}})\n",
    )


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_shell_completion_completes_both_spellings(tmp_path):
    """`-sc install=bash` from `python -m cart_sweeps`; bash then completes it and `cart-sweeps` alike."""
    script = cli("cart_sweeps", "-sc", "install=bash", runs=tmp_path).stdout
    app = Path(sys.executable).parent / "cart-sweeps"
    ask = "COMP_LINE='{}'; COMP_WORDS=($COMP_LINE); COMP_CWORD=${{#COMP_WORDS[@]}}; COMP_CWORD=$((COMP_CWORD-1)); "
    ask += 'COMP_POINT=${{#COMP_LINE}}; _cart_sweeps_complete; echo "${{COMPREPLY[*]}}"'
    lines = [
        f"{sys.executable} -m cart_sweeps model.n_l",
        f"{sys.executable} -m cart_sweeps stage=",
        f"{app} trainer.st",
    ]
    done = subprocess.run(
        ["bash", "-c", "\n".join([script, *(ask.format(line) for line in lines)])],
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.stdout.splitlines() == [
        "model.n_layers= model.n_loops=",
        "stage=1 stage=2 stage=ablations stage=adhoc stage=benchmarks stage=ladder stage=lr stage=parity "
        "stage=variable_r",
        "trainer.steps=",
    ], done.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["stage=1", "hydra.sweep.dir=elsewhere"],
            "hydra.sweep.dir=elsewhere: a stage's runs go to "
            "<paths.runs>/<stage>/<label>-<id>; set paths.runs=DIR instead (its runs then land in DIR/1/)",
        ),
        (
            ["stage=1", "hydra.job.chdir=true"],
            "hydra.job.chdir=true: Hydra's own settings do not reach a stage's runs (its driver launches them; "
            "hydra.searchpath is the one it reads); drop it, or set it on one run without stage=",
        ),
        (["--cfg", "job", "model.n_loop=6"], "model.n_loop: model has no setting n_loop; did you mean model.n_loops?"),
        (
            ["stage=paritty"],
            "In 'config': Could not find 'stage/paritty'; did you mean stage=parity? "
            "(available: 1, 2, ablations, adhoc, benchmarks, ladder, lr, parity, variable_r)",
        ),
    ],
)
def test_hydra_mistakes_are_one_line_with_advice(tmp_path, args, says):
    """Under a stage or not, with --cfg or not: one line, exit 2; a misspelling gets its likely meaning."""
    proc = cli("cart_sweeps", "scale=tiny", *args, runs=tmp_path)
    assert (proc.returncode, proc.stderr) == (2, f"error: {says}\n")


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_the_stage_view_prints_a_command_that_runs_and_honours_p(tmp_path):
    """`--cfg job` under a stage ends in the plan command, which runs as printed; `-p model` shows each run's."""
    stage = ["stage=1", "scale=tiny", "model.d_model=32", "model.n_prelude=2", "model.n_loops=range(2,3)"]
    shown = cli("cart_sweeps", *stage, "--cfg", "job", "--resolve", runs=tmp_path).stdout.splitlines()
    assert "# its 1 run (label-id: the overrides each run receives)" in shown
    command = shown[-1].removeprefix("# cost and ledger status: ")
    assert (
        command
        == "python -m cart_sweeps.plan stage=1 scale=tiny model.d_model=32 model.n_prelude=2 'model.n_loops=range(2,3)'"
    )
    planned = subprocess.run(
        [sys.executable, *shlex.split(command)[1:]], env=env(tmp_path), capture_output=True, text=True, cwd=tmp_path
    )
    assert planned.returncode == 0 and re.search(r"stage 1 at scale=tiny: 1 run\s", planned.stdout), planned.stderr
    model = cli("cart_sweeps", *stage, "--cfg", "job", "-p", "model", "--resolve", runs=tmp_path).stdout
    assert re.match(r"# d32-P2-R2-s42-\w{8}: model\nname: cart\nd_model: 32\n", model) and "vocab_size: 4096" in model


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_help_names_the_program_and_lists_options_only(tmp_path):
    """`cart_sweeps is powered by Hydra` (not __main__), launchers without their schemas, plan's every stage."""
    shown = cli("cart_sweeps", "--help", runs=tmp_path).stdout
    assert shown.startswith("cart_sweeps is powered by Hydra.") and "\nlauncher: local, slurm\n" in shown
    stages = "1|2|ablations|adhoc|benchmarks|ladder|lr|parity|variable_r"
    assert stages in cli("cart_sweeps.plan", "--help", runs=tmp_path).stdout


def test_widths_at_the_scale_read_back_to_the_papers():
    """`model.d_model=32,48 scale=tiny` is the paper's 256 and 512, and range() sweeps like a list."""
    stage = Stage(["stage=1", "scale=tiny", "model.d_model=32,48", "model.n_loops=range(2,5,2)", "model.n_prelude=2"])
    assert [(r.params["model.d_model"], r.params["model.n_loops"], r.actual) for r in stage.runs] == [
        (256, 2, {"model.d_model": 32}),
        (256, 4, {"model.d_model": 32}),
        (512, 2, {"model.d_model": 48}),
        (512, 4, {"model.d_model": 48}),
    ]
    assert [r.config.cfg.model.d_model for r in stage.runs] == [32, 32, 48, 48]
    assert stage.runs[0].run_id == Stage(["stage=1", "scale=tiny", "model.d_model=256"]).runs[0].run_id


def test_progress_in_a_log_is_plain_lines_with_an_eta():
    out = io.StringIO()
    progress = RunProgress("d32-P2-R2-s42", steps=4, stream=out)
    for step in (1, 2, 3, 4):
        progress.update({"step": step, "loss": 9.0 - step, "tokens_per_s": 1000.0})
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "d32-P2-R2-s42: step 1/4 loss 8.0000 1,000 tokens/s ETA ?"
    assert lines[-1].startswith("d32-P2-R2-s42: step 4/4 loss 5.0000 1,000 tokens/s ETA 0m00s")
    assert len(lines) == 2  # at most one line per 10 s between the first and the last


def test_a_jobs_output_and_traceback_land_in_its_run_log(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), output_to_run_log(tmp_path / "run") as log:
        print("from python", flush=True)
        os.write(2, b"from fd 2\n")
        raise RuntimeError("boom")
    text = log.read_text()
    assert "from python\nfrom fd 2\n" in text and "Traceback" in text and "RuntimeError: boom" in text
    print("after")  # fd 1 is the test's again


def test_a_command_leaves_what_is_alive_at_exit_to_the_os_and_still_runs_its_exit_handlers(tmp_path):
    """A relaunch of 1,024 finished runs spent 0.5 s of its 3.2-3.8 s collecting its configs' cycles at exit:
    commands skip that collection (Python promises no finalizers at exit), and what they do at exit still runs."""
    code = (
        "import atexit, sys\n"
        "from cart_sweeps.collector import skip_final_collection\n"
        "class Cycle:\n"
        "    def __del__(self): print('collected at exit', flush=True)\n"
        "atexit.register(print, 'exit handler ran')\n"
        "if sys.argv[1] == 'command': skip_final_collection()\n"
        "garbage = Cycle(); garbage.me = garbage; del garbage\n"
    )
    outputs = {
        mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=60).stdout
        for mode in ("plain", "command")
    }
    assert outputs == {"plain": "exit handler ran\ncollected at exit\n", "command": "exit handler ran\n"}


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`python -m cart_sweeps ARGS` through the real main() in this process: exit code, stdout, stderr."""
    from cart_sweeps.__main__ import main

    monkeypatch.setenv(SEARCHPATH_ENV, "[]")  # main() records its config sources in the environment: restored
    monkeypatch.setenv(CONFIG_NAME_ENV, "config")
    monkeypatch.setattr(sys, "argv", ["cart_sweeps", *args])
    try:
        main()
        code = 0
    except SystemExit as ended:
        code = int(ended.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        (
            "typo",
            "name: typo\ngrid: {model.n_loops: [2, 3]}\nreicpe: {seed: 7}\n",
            "reicpe is no setting; did you mean recipe?",
        ),
        (
            "one",
            "name: one\ngrid: {model.n_loops: 2}\n",
            "grid.model.n_loops: 2 is one value where a list is wanted: write [2]",
        ),
    ],
)
def test_a_mistake_inside_a_stage_file_is_one_line_naming_the_file_the_key_and_the_fix(
    tmp_path, monkeypatch, capsys, name, text, says
):
    """Hydra's own line was "ConfigKeyError raised while composing config:", with nothing after the colon."""
    (tmp_path / "stage").mkdir()
    (tmp_path / "stage" / f"{name}.yaml").write_text(text)
    done = run_main(monkeypatch, capsys, "--config-dir", str(tmp_path), f"stage={name}", "scale=tiny")
    assert done == (2, "", f"error: {tmp_path / 'stage' / name}.yaml: {says}\n")


def test_a_mistake_inside_a_shipped_stage_file_is_one_line(tmp_path):
    """sweeps/*.yaml are read before any composition (register_configs): a typo there was a traceback."""
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "1.yaml").write_text("name: '1'\nreicpe: {seed: 7}\n")
    code = (
        "import pathlib, sys\nimport cart_sweeps.register as register\n"
        "register.SWEEPS_DIR = pathlib.Path(sys.argv[1])\nsys.argv[1:] = ['stage=1']\n"
        "from cart_sweeps.__main__ import main\nmain()\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(sweeps)], env=env(tmp_path), capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (
        2,
        f"error: {sweeps / '1.yaml'}: reicpe is no setting; did you mean recipe?\n",
    )


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["lr=1e-3"], "lr: the config has no setting lr; did you mean trainer.lr=1e-3?"),
        (["stage=1", "lr=1e-3"], "lr: the config has no setting lr; did you mean trainer.lr=1e-3?"),
        (["stage=1", "n_loops=2,4"], "n_loops: the config has no setting n_loops; did you mean model.n_loops=2,4?"),
        (["model.lr=3e-4"], "model.lr: model has no setting lr; did you mean trainer.lr=3e-4?"),
    ],
)
def test_a_setting_named_by_its_last_part_gets_its_full_name(monkeypatch, capsys, args, says):
    assert run_main(monkeypatch, capsys, "scale=tiny", *args) == (2, "", f"error: {says}\n")


def test_a_stage_not_found_names_the_stages_and_the_config_folder(tmp_path, monkeypatch, capsys, user_configs):
    listing = "available: 1, 2, ablations, adhoc, benchmarks, ladder, lr, parity, variable_r"
    assert run_main(monkeypatch, capsys, "stage=mystage") == (
        2,
        "",
        f"error: In 'config': Could not find 'stage/mystage'; {listing}; a stage of your own: "
        "DIR/stage/mystage.yaml, found with --config-dir DIR\n",
    )
    code, _, err = run_main(monkeypatch, capsys, "--config-dir", str(user_configs), "stage=mystage")
    assert code == 2 and err.endswith(f"; no stage/mystage.yaml in {user_configs} either\n") and "mine" in err


def test_an_adhoc_multiruns_plan_command_runs_as_printed(tmp_path, monkeypatch, capsys):
    """The printed command named no stage (the ad-hoc stage is the command's own): plan refused it."""
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path))
    code, out, _ = run_main(monkeypatch, capsys, "-m", "model.n_loops=2,4", "scale=tiny", "--cfg", "job")
    command = out.splitlines()[-1].removeprefix("# cost and ledger status: ")
    assert code == 0 and re.fullmatch(
        r"python -m cart_sweeps.plan model.n_loops=2,4 scale=tiny stage=adhoc "
        r"stage.name=adhoc-\w{8}",
        command,
    ), command
    planned = subprocess.run(
        [sys.executable, *shlex.split(command)[1:]], env=env(tmp_path), capture_output=True, text=True, cwd=tmp_path
    )
    assert planned.returncode == 0 and re.search(r"stage adhoc-\w{8} at scale=tiny: 2 runs\s", planned.stdout), (
        planned.stderr
    )


REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_help_shows_the_torch_version_it_installs():
    shown = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=60).stdout
    assert "$(" not in shown and re.search(r"make setup +create \.venv: torch \d+\.\d+\.\d+ unless", shown), shown


def test_what_configs_and_code_point_at_lies_inside_the_repository():
    """conf/model/cart.yaml pointed at ../shared/REFERENCE.md, outside any clone: a pointer to a markdown file
    names one in the repository."""
    pointers = re.compile(r"(?:\.\./)+[\w./-]+\.md|\bdocs/[\w./-]+\.md")
    found = {
        (path.relative_to(REPO), ref)
        for top in ("conf", "sweeps", "src")
        for path in (REPO / top).rglob("*")
        if path.suffix in (".yaml", ".py") and path.is_file()
        for ref in pointers.findall(path.read_text())
    }
    assert ("conf/model/cart.yaml", "docs/reference.md") in {(str(p), r) for p, r in found}
    assert [
        (p, r)
        for p, r in found
        if not (REPO / p).parent.joinpath(r).resolve().is_relative_to(REPO)
        or not ((REPO / r).is_file() or (REPO / p).parent.joinpath(r).is_file())
    ] == []


def test_a_stage_file_named_as_a_shipped_stage_is_refused_in_one_line(tmp_path):
    """DIR/stage/lr.yaml was merged onto the shipped sweeps/lr.yaml (Hydra's automatic schema matching): the
    shipped search range leaked into the user's grid stage, which then trained runs it never asked for."""
    cfg = user_stage(tmp_path, "name: lr\ngrid:\n  model.n_loops: [1, 2]\nrecipe:\n  model.d_model: 32\n")
    args = ["--config-dir", str(cfg), "stage=lr", "scale=tiny", "model.n_prelude=1", "trainer.steps=2"]
    proc = cli("cart_sweeps", *args, "launcher.slots=2", runs=tmp_path, timeout=300)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr[-3000:]
    assert proc.stderr == (
        f"error: {cfg / 'stage' / 'lr.yaml'}: a shipped stage is named lr too (sweeps/lr.yaml); rename your file "
        "and its name: (stage/my_lr.yaml, run as stage=my_lr); `defaults: [lr, _self_]` in it starts from the "
        "shipped one\n"
    )
    assert not (tmp_path / "lr").exists()


def test_a_stage_file_may_start_from_a_shipped_stage(monkeypatch, tmp_path):
    """docs/commands.md: `defaults: [lr, _self_]` in DIR/stage/mine.yaml is the shipped lr with mine's settings."""
    cfg = user_stage(tmp_path, "name: mine\ndefaults: [lr, _self_]\nrecipe:\n  model.d_model: 256\n")
    monkeypatch.setenv(SEARCHPATH_ENV, "[]")
    use_config_sources(str(cfg), None, [])
    stage = compose_config(["stage=mine"]).stage
    shipped = yaml.safe_load((Path(__file__).parents[1] / "sweeps" / "lr.yaml").read_text())
    assert stage.name == "mine" and stage.search == shipped["search"]
    assert stage.recipe == {**shipped["recipe"], "model.d_model": 256}
