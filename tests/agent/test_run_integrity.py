"""A run directory has one writer, and SIGTERM / SIGHUP stop a run as Ctrl-C does (real processes, tiny runs)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agent.test_cli import _comparable, _config_file, _steps, _weights
from tests.agent.test_trainer import ROOT, state_equal
from trace_agent.cli import main
from trace_agent.errors import RunDirError
from trace_agent.rundir import LOCK_FILE, deferred_stops, lock_run_dir, raise_if_stopped, stop_signals

_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _train(*args: str) -> subprocess.Popen:
    """``trace-gym train ARGS`` in a fresh Python (the Parity test env registered), Ctrl-C handled as in a terminal."""
    script = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "import tests.agent.test_trainer; from trace_agent.cli import main; "
              f"sys.exit(main(['train', *{list(args)!r}]))")
    return subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=_ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _holder(run: Path) -> subprocess.Popen:
    """A process that holds ``run``'s lock until it is killed (it prints ``held`` once it has it)."""
    script = ("import sys, time; from trace_agent.rundir import lock_run_dir\n"
              f"with lock_run_dir({str(run)!r}):\n    print('held', flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=_ENV, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.slow
def test_two_trains_on_one_directory_one_runs_the_other_is_refused(tmp_path: Path) -> None:
    cfg = _config_file(tmp_path, steps=6)  # the first holds the directory long after the second has started
    run = tmp_path / "run"
    procs = [_train("--config", str(cfg), "--out", str(run), "--no-eval") for _ in range(2)]
    results = [(p.pid, *p.communicate(timeout=300), p.returncode) for p in procs]
    codes = sorted(r[3] for r in results)
    assert codes == [0, 1], [r[2][-2000:] for r in results]
    (winner, *_), (_, _, err, _) = sorted(results, key=lambda r: r[3])
    line = err.strip().splitlines()[-1]
    assert line.startswith("trace-gym: error: ") and err.strip().count("\n") == 0, err
    assert f"in use by another trace-gym run (pid {winner} on host {socket.gethostname()})" in line
    assert _steps(run) == [1, 2, 3, 4, 5, 6]  # every step once: the refused run wrote nothing


def test_a_locked_directory_refuses_train_and_resume_and_a_dead_holders_lock_is_taken_over(
        tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        with pytest.raises(RunDirError, match=f"pid {holder.pid} on host "), lock_run_dir(run):
            pass
        cfg = _config_file(tmp_path, steps=1)
        capsys.readouterr()
        assert main(["train", "--config", str(cfg), "--out", str(run), "--no-eval"]) == 1
        assert f"pid {holder.pid}" in capsys.readouterr().err
        assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]  # nothing was written
        shutil.copy(cfg, run / "config.yaml")  # a run directory, as far as --resume is concerned
        assert main(["train", "--resume", str(run), "--no-eval"]) == 1
        assert f"in use by another trace-gym run (pid {holder.pid} on host" in capsys.readouterr().err
        assert sorted(p.name for p in run.iterdir()) == ["config.yaml", LOCK_FILE]
    finally:
        holder.kill()  # SIGKILL: no cleanup runs; the kernel drops the flock with the process
        holder.wait()
    with lock_run_dir(run), lock_run_dir(run):  # taken over, and re-entrant within this process
        assert f"pid={os.getpid()} " in (run / LOCK_FILE).read_text()
    with lock_run_dir(run):  # released when the outermost block ended
        pass


def test_a_bench_out_dir_another_process_holds_is_refused_before_any_work(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench"
    holder = _holder(out)
    try:
        capsys.readouterr()
        assert main(["bench", "--seeds", "1", "--prompts", "2", "--budget", "4,1", "--no-progress",
                     "--out", str(out)]) == 1
        assert f"in use by another trace-gym run (pid {holder.pid} on host" in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing was written
    finally:
        holder.kill()
        holder.wait()


def test_sighup_stops_like_ctrl_c_and_an_ignored_sighup_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    inherited = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # this suite may itself run under nohup
    try:
        with pytest.raises(KeyboardInterrupt), stop_signals() as caught:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)  # the handler raises before this ends
        assert caught == [signal.SIGHUP]
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # restored
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
        with stop_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, inherited)
        signal.signal(signal.SIGINT, previous)


def test_a_stop_during_a_checkpoint_write_arrives_when_the_write_is_done() -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    done = []
    try:
        with pytest.raises(KeyboardInterrupt), stop_signals() as caught:
            with deferred_stops():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)  # delivered at once if it were not held back
                done.append("written")
            time.sleep(5)  # the handler raises before this ends
        assert done == ["written"] and caught == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_sigterm_mid_run_stops_cleanly_and_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    cfg = _config_file(tmp_path, steps=40)
    run = tmp_path / "stopped"
    proc = _train("--config", str(cfg), "--out", str(run), "--no-eval")
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "step_000001" / "manifest.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("trace-gym: stopped after step ") and " by SIGTERM" in last, last
    assert last.endswith(f"resume with: trace-gym train --resume {run}"), last
    from trace_agent.trainer import Trainer

    ckpt = Trainer.latest_checkpoint(run)
    assert ckpt is not None
    target = int(ckpt.name.split("_")[1]) + 1
    assert main(["train", "--resume", str(run), "--steps", str(target), "--no-eval"]) == 0
    straight = tmp_path / "straight"
    assert main(["train", "--config", str(cfg), "--out", str(straight), "--steps", str(target), "--no-eval"]) == 0
    assert _steps(run) == list(range(1, target + 1))
    assert _comparable(run) == _comparable(straight)
    trees = sorted(p.name for p in (straight / "trees").iterdir())
    assert trees == sorted(p.name for p in (run / "trees").iterdir()) and len(trees) == target
    assert all((run / "trees" / n).read_bytes() == (straight / "trees" / n).read_bytes() for n in trees)
    assert state_equal(_weights(run), _weights(straight))


def test_sigterm_stops_like_ctrl_c_over_a_handler_a_library_installed() -> None:
    """Ray's ``ray.init`` leaves a SIGTERM handler that exits at once: within a run it is replaced, then restored."""
    foreign = []

    def library_handler(signum, frame):  # what ray.init installs: sys.exit(signum)
        foreign.append(signum)

    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, library_handler)
    try:
        with pytest.raises(KeyboardInterrupt), stop_signals() as caught:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        assert caught == [signal.SIGTERM] and foreign == []
        assert signal.getsignal(signal.SIGTERM) is library_handler
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


class _StopsInFinalizer:
    """An object whose ``__del__`` gets the stop signal: the KeyboardInterrupt raised there is printed and lost."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        time.sleep(0.05)  # the handler runs here, inside the finalizer


def test_a_stop_whose_interrupt_a_finalizer_swallowed_is_still_recorded(monkeypatch) -> None:
    ignored: list[type] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: ignored.append(u.exc_type))  # "Exception ignored in"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with stop_signals() as caught:
            _StopsInFinalizer(signal.SIGINT)  # dropped at once: __del__ runs, its KeyboardInterrupt is ignored
            assert caught == [signal.SIGINT]  # ... yet the stop is on record, for the loop to act on
            with pytest.raises(KeyboardInterrupt):
                raise_if_stopped(caught)
        assert ignored == [KeyboardInterrupt]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


class _RaisesInFinalizer:
    def __del__(self) -> None:
        raise ValueError("a finalizer's own bug")


def test_a_stop_lost_in_a_finalizer_prints_no_traceback_and_other_errors_still_do(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with stop_signals() as caught:
            _RaisesInFinalizer()
            _StopsInFinalizer(signal.SIGINT)
            assert caught == [signal.SIGINT]
            _RaisesInFinalizer()
        assert sys.unraisablehook is sys.__unraisablehook__
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert err.count("Exception ignored") == 2 and err.count("ValueError: a finalizer's own bug") == 2
    assert "KeyboardInterrupt" not in err


def test_a_run_stops_at_the_next_step_when_a_finalizer_swallowed_the_ctrl_c(tmp_path: Path, monkeypatch,
                                                                           capsys) -> None:
    """The stop is honoured at the step boundary: the run says where it stopped, exits 130, and resumes."""
    from trace_agent.trainer import Trainer

    step = Trainer.step

    def step_then_lost_interrupt(self):
        result = step(self)
        if self.step_count == 2:
            _StopsInFinalizer(signal.SIGINT)
        return result

    monkeypatch.setattr(Trainer, "step", step_then_lost_interrupt)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: None)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cfg = _config_file(tmp_path, steps=5)
        run = tmp_path / "run"
        assert main(["train", "--config", str(cfg), "--out", str(run), "--no-eval"]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert _steps(run) == [1, 2]
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("trace-gym: stopped after step 2") and f"resume with: trace-gym train --resume {run}" in last
