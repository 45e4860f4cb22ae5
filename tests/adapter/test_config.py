from __future__ import annotations

import threading
from pathlib import Path

import pytest

from async_local_executor.adapter import config, startup, validation
from async_local_executor.adapter.config import (
    OPTIONS,
    SECTION,
    ContainmentKind,
    EventLoop,
    ExecutorConfig,
    LauncherKind,
)
from async_local_executor.core.cgroups import Limits
from async_local_executor.ops import state_dir
from tests.adapter import workloads
from tests.adapter.driver import RecordingExecutor, Scheduler, loop_threads


class DictConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, section: str, key: str, fallback: str = "") -> str | None:
        assert section == "async_local_executor"
        return self.values.get(key, fallback)


def test_defaults() -> None:
    config = ExecutorConfig.from_conf(DictConf({}))
    assert config == ExecutorConfig()
    assert (config.shutdown_timeout, config.termination_grace_period, config.event_loop) == (
        60.0,
        10.0,
        EventLoop.AUTO,
    )
    assert (config.launcher, config.preload_modules) == (LauncherKind.FORKSERVER, ())
    assert config.workload_cpu_priority == "auto"


def test_values_are_read() -> None:
    config = ExecutorConfig.from_conf(
        DictConf(
            {
                "shutdown_timeout": "5",
                "termination_grace_period": "1.5",
                "event_loop": "AsyncIO",
                "launcher": "subprocess",
                "preload_modules": " numpy, pandas ,,",
                "prefetch_multiplier": "0.5",
                "forkserver_idle_timeout": "300",
                "queue_limits": " reports:4 , default:28,",
                "min_available_memory_mb": "512",
                "workload_cpu_priority": " 07 ",
            }
        )
    )
    assert config.forkserver_idle_timeout == 300.0
    assert config.queue_limits == (("reports", 4), ("default", 28))
    assert config.min_available_memory_mb == 512.0
    assert config.workload_cpu_priority == "7"
    assert config.prefetch(32) == 16
    assert config.prefetch(3) == 2  # rounded up: any multiplier above 0 prefetches something
    assert (config.shutdown_timeout, config.termination_grace_period, config.event_loop) == (
        5.0,
        1.5,
        EventLoop.ASYNCIO,
    )
    assert (config.launcher, config.preload_modules) == (LauncherKind.SUBPROCESS, ("numpy", "pandas"))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("shutdown_timeout", "soon", "shutdown_timeout must be a number, got 'soon'"),
        ("termination_grace_period", "-1", "termination_grace_period must be a finite number >= 0"),
        ("shutdown_timeout", "inf", "shutdown_timeout must be a finite number >= 0, got 'inf'"),
        ("task_timeout", "nan", "task_timeout must be a finite number >= 0, got 'nan'"),
        ("event_loop", "trio", "event_loop must be one of auto, asyncio, uvloop, got 'trio'"),
        ("launcher", "spawn", "launcher must be one of forkserver, subprocess, got 'spawn'"),
        ("prefetch_multiplier", "-0.5", "prefetch_multiplier must be a finite number >= 0"),
        ("prefetch_multiplier", "Infinity", "prefetch_multiplier must be a finite number >= 0"),
        ("queue_limits", "reports:4,default", "queue_limits must look like queue:N,queue:N"),
        ("queue_limits", "reports:0", "with N >= 1, got 'reports:0'"),
        ("queue_limits", ":3", "got ':3'"),
        ("min_available_memory_mb", "lots", "min_available_memory_mb must be a number"),
        (
            "workload_cpu_priority",
            "low",
            "workload_cpu_priority must be auto, idle, normal or a nice increment",
        ),
        ("workload_cpu_priority", "20", "from 1 to 19, got '20'"),
        ("workload_cpu_priority", "0", "got '0'"),
        ("containment", "always", "containment must be one of auto, off, got 'always'"),
        ("task_memory_limit", "lots", "task_memory_limit: memory limit must be a size such as 512M"),
        ("task_memory_limit", "1.5", "got '1.5'"),
        ("task_cpu_limit", "0", "task_cpu_limit: cpu limit must be a number of CPUs above 0"),
        ("task_pids_limit", "-3", "task_pids_limit: "),
        ("kill_leftover_processes", "maybe", "kill_leftover_processes must be True or False"),
        ("preload", "always", "preload must be one of auto, explicit, off, got 'always'"),
        ("preload_memory_budget", "plenty", "preload_memory_budget must be a size such as 512MiB"),
        ("preload_interval", "-1", "preload_interval must be a finite number >= 0"),
    ],
)
def test_invalid_values_name_the_option(key: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ExecutorConfig.from_conf(DictConf({key: value}))


def test_the_preload_options() -> None:
    default = startup.plan(
        ExecutorConfig(), parallelism=4, queued_timeout=600, fork_target="m:f", learn_dir="/s/i"
    )
    assert (default.learn_dir, default.preload) == ("/s/i", ())
    assert (default.preload_memory_budget, default.preload_interval) == (1024**3, 60.0)
    values = {
        "preload_modules": "pandas",
        "preload_exclude": " boto3, acme.heavy ",
        "preload_memory_budget": "512M",
    }
    config = ExecutorConfig.from_conf(DictConf(values))
    assert config.preload_exclude == ("boto3", "acme.heavy")
    auto = startup.plan(config, parallelism=4, queued_timeout=600, fork_target="m:f", learn_dir="/s/i")
    assert (auto.learn_dir, auto.preload, auto.preload_exclude) == (
        "/s/i",
        ("pandas",),
        ("boto3", "acme.heavy"),
    )
    assert auto.preload_memory_budget == 512 * 1024**2
    explicit = ExecutorConfig.from_conf(DictConf({**values, "preload": "explicit"}))
    plan = startup.plan(explicit, parallelism=4, queued_timeout=600, fork_target="m:f", learn_dir="/s/i")
    assert (plan.learn_dir, plan.preload) == ("", ("pandas",))
    # off: what the executor did before it learned anything, with no explicit list either.
    off = ExecutorConfig.from_conf(DictConf({**values, "preload": "off"}))
    plan = startup.plan(off, parallelism=4, queued_timeout=600, fork_target="m:f", learn_dir="/s/i")
    assert (plan.learn_dir, plan.preload) == ("", ())
    subprocess_launcher = ExecutorConfig.from_conf(DictConf({"launcher": "subprocess"}))
    plan = startup.plan(
        subprocess_launcher, parallelism=4, queued_timeout=600, fork_target="m:f", learn_dir="/s/i"
    )
    assert plan.learn_dir == ""  # nothing to preload into


def test_environment_variables_reach_the_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.configuration import conf

    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT", "7")
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER", "subprocess")  # nothing launches here
    config = ExecutorConfig.from_conf(conf)
    assert (config.shutdown_timeout, config.launcher) == (7.0, LauncherKind.SUBPROCESS)


def test_every_option_is_documented() -> None:
    assert {o.name for o in OPTIONS} == {
        "containment",
        "cgroup_root",
        "task_memory_limit",
        "task_cpu_limit",
        "task_pids_limit",
        "kill_leftover_processes",
        "shutdown_timeout",
        "on_stop",
        "handover_timeout",
        "termination_grace_period",
        "event_loop",
        "launcher",
        "forkserver_idle_timeout",
        "prefetch_multiplier",
        "task_timeout",
        "queue_limits",
        "min_available_memory_mb",
        "state_dir",
        "health_loop_lag_limit",
        "health_wait_limit",
        "workload_cpu_priority",
        "preload",
        "preload_modules",
        "preload_exclude",
        "preload_memory_budget",
        "preload_interval",
    }
    assert all(o.description for o in OPTIONS)


@pytest.mark.parametrize(
    ("executor_config", "expected"),
    [
        (None, 30.0),
        ({}, 30.0),
        ({"KubernetesExecutor": {"x": 1}}, 30.0),
        ({"async_local_executor": {"task_timeout": 5}}, 5.0),
        ({"async_local_executor": {"task_timeout": "2.5"}}, 2.5),
        ({"async_local_executor": {"task_timeout": 0}}, None),
    ],
)
def test_a_task_timeout_comes_from_the_task_else_the_option(
    executor_config: object, expected: object
) -> None:
    assert validation.task_options(executor_config, 30.0) == (expected, ())


@pytest.mark.parametrize("bad", ["soon", -1, float("nan"), float("inf"), [1], True, 10**400, "1e400"])
def test_a_bad_task_timeout_names_the_entry(bad: object) -> None:
    with pytest.raises(ValueError, match=r'\["task_timeout"\] must be a number of seconds >= 0'):
        validation.task_options({"async_local_executor": {"task_timeout": bad}}, 0.0)


def test_an_empty_state_dir_is_the_directory_under_airflow_home() -> None:
    from airflow.configuration import AIRFLOW_HOME

    assert state_dir.resolve("") == Path(AIRFLOW_HOME) / "async_local_executor"
    assert state_dir.resolve("/var/lib/ale") == Path("/var/lib/ale")


@pytest.mark.parametrize("configured", ["", "  /srv/ale-state  "])
def test_the_status_command_finds_the_state_dir_the_executor_uses(
    configured: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.configuration import conf

    monkeypatch.delenv(state_dir.ENV, raising=False)
    values = {(SECTION, "state_dir"): configured}
    monkeypatch.setattr(conf, "get", lambda section, key, fallback="": values.get((section, key), fallback))
    executors = state_dir.resolve(ExecutorConfig.from_conf(conf).state_dir)  # as the executor resolves it
    assert state_dir.from_airflow_config() == executors
    assert executors.name == ("ale-state" if configured else "async_local_executor")


def test_the_state_dir_in_the_environment_is_read_without_airflows_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.configuration import conf

    def unread(*args: object, **kwargs: object) -> str:
        raise AssertionError("read Airflow's configuration")

    monkeypatch.setattr(conf, "get", unread)
    monkeypatch.setenv(state_dir.ENV, " /srv/from-env ")
    assert state_dir.from_airflow_config() == Path("/srv/from-env")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("shutdown_timeout", "1e10", r"shutdown_timeout must be at most 4611686003 seconds: end\(\) waits"),
        ("termination_grace_period", "9.3e9", r"termination_grace_period must be at most 4611686003 sec"),
        ("min_available_memory_mb", "1e303", "min_available_memory_mb must be at most 1e[+]302 MB"),
        ("task_timeout", "1e400", "task_timeout must be a finite number >= 0, got '1e400'"),
    ],
)
def test_a_value_beyond_what_consumes_it_names_the_option(key: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^\[async_local_executor\] {message}"):
        ExecutorConfig.from_conf(DictConf({key: value}))


@pytest.mark.usefixtures("launcher")
def test_the_largest_accepted_waits_still_end_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    # end() waits on threads for shutdown_timeout + termination_grace_period + a margin: at the limit
    # that sum is threading.TIMEOUT_MAX, one second more and the wait raises OverflowError.
    largest = str(config._THREAD_WAIT_MAX)
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT", largest)
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD", largest)
    ex = RecordingExecutor(parallelism=1)
    ex.start()
    item = workloads.task("ok")
    ex.queue_workload(item, session=None)  # type: ignore[arg-type]
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: item.key in scheduler.events)
    ex.end()
    assert 2 * config._THREAD_WAIT_MAX + config.SHUTDOWN_MARGIN <= threading.TIMEOUT_MAX


def test_an_executor_started_without_a_launch_path_asked_for_refuses_to_start() -> None:
    # tests/adapter/conftest.py: a test that starts one asks for `launcher` and runs on both paths.
    ex = RecordingExecutor(parallelism=1)
    with pytest.raises(ValueError, match="launcher must be one of forkserver, subprocess, got 'unchosen"):
        ex.start()
    ex.end()
    assert loop_threads() == []


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT", "1e10", r"\[async_local_executor\] shutdown_timeout must"),
        ("ASYNC_LOCAL_EXECUTOR__PREFETCH_MULTIPLIER", "1e308", r"prefetch_multiplier x parallelism must"),
        ("SCHEDULER__TASK_QUEUED_TIMEOUT", "inf", r"\[scheduler\] task_queued_timeout must be a number"),
        ("SCHEDULER__TASK_QUEUED_TIMEOUT", "soon", r"task_queued_timeout .* got 'soon'"),
    ],
)
@pytest.mark.usefixtures("launcher")
def test_start_refuses_a_value_beyond_its_limit_naming_it(
    variable: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv(f"AIRFLOW__{variable}", value)
    ex = RecordingExecutor(parallelism=32)
    with pytest.raises(ValueError, match=message):
        ex.start()
    ex.end()  # nothing started: nothing to stop
    assert loop_threads() == []
    assert not (tmp_path / "state").exists()  # refused before it reclaimed, journaled or started anything


def test_a_config_built_directly_is_checked_too() -> None:
    with pytest.raises(ValueError, match="shutdown_timeout must be at most"):
        ExecutorConfig(shutdown_timeout=1e10)
    with pytest.raises(TypeError, match="task_timeout must be a number, got True"):
        ExecutorConfig(task_timeout=True)


def test_a_task_timeout_entry_is_read_from_our_section_only() -> None:
    ours = {"async_local_executor": {"task_timeout": 5, "later_option": 1}}
    assert validation.task_options(ours, 0.0) == (5.0, ("'later_option'",))
    assert validation.task_options(["async_local_executor"], 7.0) == (7.0, ())  # not ours to judge
    with pytest.raises(ValueError, match=r'\["async_local_executor"\] must be a dict'):
        validation.task_options({"async_local_executor": ["task_timeout", 5]}, 0.0)


def test_containment_options() -> None:
    config = ExecutorConfig.from_conf(
        DictConf(
            {
                "containment": "OFF",
                "cgroup_root": " /airflow-tasks ",
                "task_memory_limit": "512MiB",
                "task_cpu_limit": "1.5",
                "task_pids_limit": "100",
                "kill_leftover_processes": "false",
            }
        )
    )
    assert config.containment is ContainmentKind.OFF
    assert config.cgroup_root == "/airflow-tasks"
    assert config.limits == Limits(memory=512 * 1024 * 1024, cpu=1.5, pids=100)
    assert config.kill_leftover_processes is False
    defaults = ExecutorConfig.from_conf(DictConf({}))
    assert (defaults.containment, defaults.limits, defaults.kill_leftover_processes) == (
        ContainmentKind.AUTO,
        Limits(),
        True,
    )


@pytest.mark.parametrize(
    ("ours", "expected"),
    [
        ({}, Limits()),
        ({"task_memory_limit": "1G", "task_pids_limit": 50}, Limits(memory=1024**3, pids=50)),
        ({"task_cpu_limit": 0.5, "task_memory_limit": ""}, Limits(cpu=0.5)),
    ],
)
def test_a_task_s_own_limits(ours: dict[str, object], expected: Limits) -> None:
    assert validation.task_limits({"async_local_executor": ours}) == expected
    assert validation.task_limits({"other_executor": ours}) == Limits()


@pytest.mark.parametrize(
    ("ours", "message"),
    [
        (
            {"task_memory_limit": "huge"},
            'executor_config\\["async_local_executor"\\] task_memory_limit: memory limit',
        ),
        ({"task_cpu_limit": True}, "task_cpu_limit must be a string or a number, got a bool"),
        ({"task_pids_limit": [5]}, "task_pids_limit must be a string or a number, got a list"),
    ],
)
def test_an_invalid_limit_of_a_task_names_it(ours: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validation.task_limits({"async_local_executor": ours})


def airflow_parser(text: str) -> config.OptionNames:
    """Airflow's own configuration parser, reading ``text`` as an airflow.cfg (nothing else of it runs)."""
    from airflow.configuration import AirflowConfigParser

    parser = AirflowConfigParser()
    parser.read_string(text)
    return parser


CFG = (
    "[async_local_executor]\nshutdown_timout = 5\non_stop = handover\nparalellism = 3\nzzz = 1\n"
    "Task_Timeout = 9\n[team_a=async_local_executor]\nhandover_timout = 4\n"
)
ENVIRON = {
    "AIRFLOW__ASYNC_LOCAL_EXECUTOR__PRELOD": "off",
    "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TASK_TIMEOUT": "5",  # valid: not reported
    "AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT_CMD": "echo 5",  # Airflow runs it for secrets only
    "AIRFLOW__ASYNC_LOCAL_EXECUTOR__state_dir": "/x",  # Airflow looks for STATE_DIR
    "AIRFLOW__TEAM_A___ASYNC_LOCAL_EXECUTOR__TASK_TIMOUT": "5",
    "AIRFLOW__CORE__PARALLELISM": "4",  # another section: not ours to judge
}


def test_what_airflow_would_not_read_as_an_option_is_found_with_the_closest_valid_one() -> None:
    found = config.unknown_options(airflow_parser(CFG), ENVIRON)
    assert [(u.name, u.where, u.closest) for u in found] == [
        ("shutdown_timout", "airflow.cfg [async_local_executor]", "shutdown_timeout"),
        ("paralellism", "airflow.cfg [async_local_executor]", "[core] parallelism"),  # Airflow's option
        ("zzz", "airflow.cfg [async_local_executor]", None),
        ("Task_Timeout", "airflow.cfg [async_local_executor]", "task_timeout"),  # Airflow reads lower case
        ("PRELOD", "AIRFLOW__ASYNC_LOCAL_EXECUTOR__PRELOD", "preload"),
        ("SHUTDOWN_TIMEOUT_CMD", "AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT_CMD", "shutdown_timeout"),
        ("state_dir", "AIRFLOW__ASYNC_LOCAL_EXECUTOR__state_dir", "state_dir"),
    ]
    assert found[0].describe() == (
        "shutdown_timout (airflow.cfg [async_local_executor]) is not an option of [async_local_executor] "
        "and is ignored; did you mean shutdown_timeout?"
    )
    assert found[1].describe().endswith("did you mean [core] parallelism?")
    assert (
        found[2]
        .describe()
        .endswith("the options are listed by `airflow config list --section async_local_executor`")
    )


def test_a_team_s_executor_judges_only_its_team_s_section_and_variables() -> None:
    # Airflow reads a team's options from there alone: the global ones are the global executor's to judge.
    found = config.unknown_options(airflow_parser(CFG), ENVIRON, "team_a")
    assert [(u.name, u.where) for u in found] == [
        ("handover_timout", "airflow.cfg [team_a=async_local_executor]"),
        ("TASK_TIMOUT", "AIRFLOW__TEAM_A___ASYNC_LOCAL_EXECUTOR__TASK_TIMOUT"),
    ]


def test_every_option_set_correctly_is_known() -> None:
    text = "[async_local_executor]\n" + "".join(f"{option.name} = {option.default}\n" for option in OPTIONS)
    environ = {f"AIRFLOW__ASYNC_LOCAL_EXECUTOR__{option.name.upper()}": "1" for option in OPTIONS}
    assert config.unknown_options(airflow_parser(text), environ) == []


@pytest.mark.usefixtures("launcher")
def test_a_started_executor_warns_of_a_misspelt_option_and_runs_with_the_default(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMOUT", "5")
    ex = RecordingExecutor(parallelism=1)
    with caplog.at_level("WARNING", logger="async_local_executor"):
        ex.start()
    try:
        assert ex._config.shutdown_timeout == 60.0  # the default stays in force: the typo is only said
        said = [r.getMessage() for r in caplog.records if "SHUTDOWN_TIMOUT" in r.getMessage()]
        expected = (
            "SHUTDOWN_TIMOUT (AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMOUT) is not an option of "
            "[async_local_executor] and is ignored; did you mean shutdown_timeout?"
        )
        assert said == [expected]
    finally:
        ex.end()


@pytest.mark.usefixtures("launcher")
def test_a_misspelt_option_is_said_even_when_another_value_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The refusal names the bad value; the typo beside it may be why the operator set it at all.
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD", "soon")
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE", "5")
    ex = RecordingExecutor(parallelism=1)
    with caplog.at_level("WARNING", logger="async_local_executor"), pytest.raises(ValueError, match="soon"):
        ex.start()
    ex.end()
    assert any("did you mean termination_grace_period?" in r.getMessage() for r in caplog.records)
