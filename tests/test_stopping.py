"""Stopping early on a signal: SIGTERM, SIGUSR1 (what Slurm sends before a time limit or preemption) and Ctrl-C let
the step in progress finish, save it and stop with an exit code that says what to do next; a second Ctrl-C stops at
once. Whole runs that stop and resume (one process and two) are in test_runs.py."""

from __future__ import annotations

import logging
import os
import signal
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainerState

import grpo_demo
from grpo_kit import evaluation, stopping


@pytest.fixture(autouse=True)
def ctrl_c_as_from_a_terminal():
    """Ctrl-C handled as in a terminal: a shell's background job (CI may be one) starts with SIGINT ignored, and an
    ignored signal stays ignored (tested below)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def fake_trainer(state: TrainerState):
    return SimpleNamespace(
        accelerator=SimpleNamespace(
            is_main_process=True, is_local_main_process=True, device=torch.device("cpu"), wait_for_everyone=lambda: None
        ),
        callback_handler=SimpleNamespace(callbacks=[]),
        state=state,
        model=SimpleNamespace(),
    )


def stop_after(sent: list[str], step: int = 5, max_steps: int = 10):
    """Step `step` of `max_steps` as the trainer runs it, `sent` signals arriving in its middle: (the callback, the
    trainer's control after the step)."""
    state, control = TrainerState(global_step=step - 1, max_steps=max_steps), TrainerControl()
    trainer = fake_trainer(state)
    with stopping.on_signals(trainer) as stop:
        assert trainer.callback_handler.callbacks == [stop]
        stop.on_train_begin(None, state, control)
        for name in sent:
            os.kill(os.getpid(), getattr(signal, name))  # Python runs the handler before the next line
        assert not control.should_training_stop  # the step goes on
        state.global_step = step
        stop.on_step_end(None, state, control)
    return stop, control


@pytest.mark.parametrize(
    ("name", "said", "code"),
    [
        ("SIGTERM", "SIGTERM: finishing step 5 of 10, saving it, then stopping (exit 75)", 75),
        ("SIGUSR1", "SIGUSR1: finishing step 5 of 10, saving it, then stopping (exit 75)", 75),
        ("SIGINT", "Ctrl-C: finishing step 5 of 10, saving it, then stopping (exit 130); Ctrl-C again stops at", 130),
    ],
)
def test_a_stop_signal_saves_the_step_in_progress_then_exits_with_its_code(name, said, code, capfd, caplog):
    stop, control = stop_after([name])
    assert said in capfd.readouterr().err  # said when it comes
    assert control.should_save and control.should_training_stop  # checkpoint-5, then the end of training
    with caplog.at_level(logging.WARNING, logger="grpo_demo"), pytest.raises(SystemExit) as end:
        stopping.exit_if_stopped(stop)
    assert end.value.code == code
    what = "Ctrl-C (SIGINT)" if name == "SIGINT" else name
    assert f"Stopped at step 5: {what} received. Saved: checkpoint-5. --resume_from_checkpoint latest" in caplog.text


def test_the_same_request_again_is_one_stop(capfd):
    """Slurm signals every process of a step, and accelerate launch passes the signal on too: one stop, said once."""
    stop, control = stop_after(["SIGTERM", "SIGUSR1", "SIGTERM"])
    assert control.should_save and control.should_training_stop
    assert capfd.readouterr().err.count("finishing step 5") == 1


@pytest.mark.parametrize("sent", [["SIGINT", "SIGINT"], ["SIGINT", "SIGTERM"], ["SIGTERM", "SIGINT"]])
def test_ctrl_c_again_stops_at_once(sent):
    """A second Ctrl-C; under accelerate launch a second Ctrl-C reaches the processes as SIGTERM."""
    with pytest.raises(KeyboardInterrupt):
        stop_after(sent)


def test_a_signal_in_the_last_step_lets_the_run_finish(capfd):
    stop, control = stop_after(["SIGTERM"], step=10, max_steps=10)
    assert "the last step is done or under way, so the run finishes" in capfd.readouterr().err
    assert stop.stopped is None and not control.should_training_stop
    stopping.exit_if_stopped(stop)  # no exit: the final evaluation and the model follow


def test_no_signal_no_stop():
    stop, control = stop_after([])
    assert stop.stopped is None and not (control.should_save or control.should_training_stop)


def test_the_handlers_before_are_put_back_and_an_ignored_signal_stays_ignored():
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # as nohup or a shell's background job leaves a signal
    try:
        with stopping.on_signals(fake_trainer(TrainerState())) as stop:
            assert signal.getsignal(signal.SIGTERM) == stop.receive
            assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_a_stopping_step_saves_before_any_accuracy_evaluation(monkeypatch):
    """A scheduler's grace is short: the step's checkpoint comes first; a run that goes on still evaluates."""

    class Measured(Exception):
        pass

    def measure(*args):
        raise Measured

    trainer = fake_trainer(TrainerState())
    accuracy = evaluation.AccuracyCallback(
        trainer, [], grpo_demo.ANSWER_FORMAT, before_and_after=False, every_steps=5, subset=8, batch_size=8, limit=None
    )
    monkeypatch.setattr(accuracy, "measure", measure)
    args, state = SimpleNamespace(output_dir="run"), TrainerState(global_step=5, max_steps=10)
    accuracy.on_step_end(args, state, TrainerControl(should_training_stop=True))  # stopping here: no evaluation
    with pytest.raises(Measured):
        accuracy.on_step_end(args, state, TrainerControl())
