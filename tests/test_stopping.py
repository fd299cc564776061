"""Stopping early on a signal: SIGTERM, SIGUSR1 (what Slurm sends before a time limit or preemption), SIGHUP (a closed
terminal) and Ctrl-C let the step in progress finish, save it and stop with an exit code that says what to do next; a
second Ctrl-C stops at once. Whole runs that stop and resume (one process and two) are in test_runs.py."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import traceback
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState
from transformers.trainer_callback import CallbackHandler

import grpo_demo
from grpo_kit import evaluation, stopping


@pytest.fixture(autouse=True)
def ctrl_c_as_from_a_terminal():
    """Ctrl-C and a hangup handled as in a terminal: a shell's background job (CI may be one) starts with SIGINT
    ignored, one under nohup with SIGHUP ignored, and an ignored signal stays ignored (tested below)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    hangup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGINT, before)
    signal.signal(signal.SIGHUP, hangup)


def fake_trainer(state: TrainerState, save_only_model: bool = False):
    return SimpleNamespace(
        accelerator=SimpleNamespace(
            is_main_process=True, is_local_main_process=True, device=torch.device("cpu"), wait_for_everyone=lambda: None
        ),
        callback_handler=SimpleNamespace(callbacks=[]),
        state=state,
        model=SimpleNamespace(),
        args=SimpleNamespace(output_dir="outputs/run", save_only_model=save_only_model),
    )


def in_two_processes(target, tmp_path, timeout: float = 60) -> list:
    """`target(rank)` in two processes of one torch.distributed group (gloo, on the CPU, as under `accelerate launch`
    without GPUs): what each returned, by rank. Forked, so that neither imports torch again (a few seconds on a
    loaded machine); a process that fails fails the test with its traceback, one that waits too long fails it too,
    never hangs it."""
    context = multiprocessing.get_context("fork")
    answers = context.Queue()

    def process(rank: int) -> None:
        try:
            store = torch.distributed.FileStore(str(tmp_path / "processes"), 2)
            torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=2)
            answers.put((rank, target(rank)))
            torch.distributed.destroy_process_group()
        except Exception:  # noqa: BLE001 - said in the test's failure, not lost in the child
            answers.put((rank, RuntimeError(traceback.format_exc())))

    processes = [context.Process(target=process, args=(rank,), daemon=True) for rank in range(2)]
    for started in processes:
        started.start()
    returned = {}
    try:
        while len(returned) < len(processes):
            rank, answer = answers.get(timeout=timeout)
            if isinstance(answer, RuntimeError):
                raise answer
            returned[rank] = answer
    finally:
        for started in processes:
            started.join(timeout=5)
            if started.is_alive():
                started.kill()
    return [returned[0], returned[1]]


def stop_after(sent: list[str], step: int = 5, max_steps: int = 10, save_only_model: bool = False):
    """Step `step` of `max_steps` as the trainer runs it, `sent` signals arriving in its middle: (the callback, the
    trainer's control after the step)."""
    state, control = TrainerState(global_step=step - 1, max_steps=max_steps), TrainerControl()
    trainer = fake_trainer(state, save_only_model)
    with stopping.on_signals(trainer) as stop:
        stop.on_step_begin(None, state, control)
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
        ("SIGHUP", "SIGHUP: finishing step 5 of 10, saving it, then stopping (exit 75)", 75),  # a closed terminal
        ("SIGINT", "Ctrl-C: finishing step 5 of 10, saving it, then stopping (exit 130); Ctrl-C again stops at", 130),
    ],
)
def test_a_stop_signal_saves_the_step_in_progress_then_exits_with_its_code(name, said, code, capfd, caplog):
    stop, control = stop_after([name])
    assert said in capfd.readouterr().err  # said when it comes
    assert control.should_save and control.should_training_stop  # checkpoint-5, then the end of training
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        assert stopping.exit_code(stop) == code
    what = "Ctrl-C (SIGINT)" if name == "SIGINT" else name
    assert f"Stopped at step 5: {what} received. Saved: checkpoint-5. Continue the run: python " in caplog.text
    assert caplog.text.rstrip().endswith(" --resume_from_checkpoint latest")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["grpo_demo.py", "--demo"], "python grpo_demo.py --demo --resume_from_checkpoint latest"),
        (
            ["grpo_demo.py", "--demo", "--resume_from_checkpoint", "outputs/demo-GRPO/checkpoint-20", "--seed", "3"],
            "python grpo_demo.py --demo --seed 3 --resume_from_checkpoint latest",
        ),  # fmt: skip
        (
            ["grpo_demo.py", "--config", "configs/gspo.yaml", "--resume_from_checkpoint=true", "--ask", "What's 2+2?"],
            "python grpo_demo.py --config configs/gspo.yaml --ask 'What'\"'\"'s 2+2?'",  # a question starts again
        ),
    ],
)
def test_the_resume_hint_is_this_runs_command_resuming_from_latest(argv, said):
    from grpo_kit.runs import resume_command

    assert resume_command(argv) == said


def test_a_hangup_that_took_the_terminal_still_saves_the_step_and_exits_75():
    """A closed terminal window or a lost ssh connection: SIGHUP, and writing to the terminal (or to `| tee`, gone
    with it) fails from then on. The run goes on to save its step (its output to os.devnull), then exits 75."""
    import pty

    kept = {fd: os.dup(fd) for fd in (1, 2)}
    terminal, screen = pty.openpty()
    reader, pipe = os.pipe()
    try:
        os.dup2(screen, 2)  # stderr on the terminal, stdout through a pipe
        os.dup2(pipe, 1)
        os.close(terminal)  # the window closed: the terminal hangs up
        os.close(reader)  # and `| tee` ended with it
        stop, control = stop_after(["SIGHUP"])
        assert os.write(1, b"progress bar") and os.write(2, b"log line")  # the run's next lines: no error
    finally:
        for fd, copy in kept.items():
            os.dup2(copy, fd)
            os.close(copy)
        os.close(screen)
        os.close(pipe)
    assert control.should_save and control.should_training_stop
    assert stopping.exit_code(stop) == 75


@pytest.mark.parametrize(("name", "code"), [("SIGTERM", 1), ("SIGUSR1", 1), ("SIGHUP", 1), ("SIGINT", 130)])
def test_a_stop_under_save_only_model_says_it_cannot_be_resumed_and_exits_not_75(name, code, capfd, caplog):
    """--save_only_model saves no optimizer state: a resume would skip the checkpoint and start from step 0, so a
    supervisor retrying on 75 would never get further. Said as the run starts, when the signal comes and at the stop."""
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        stop, control = stop_after([name], save_only_model=True)
        assert control.should_save and control.should_training_stop  # the step's model is saved all the same
        assert stopping.exit_code(stop) == code
    model_only = (
        "--save_only_model true: checkpoints hold the model alone, no optimizer state, so a stopped or crashed run "
        "cannot be resumed"
    )
    assert f"{model_only}: SIGTERM, SIGUSR1 or SIGHUP saves the step's model and exits 1, not 75" in caplog.text
    assert f"saving it, then stopping (exit {code})" in capfd.readouterr().err
    assert caplog.text.rstrip().endswith(
        f"Saved: checkpoint-5. {model_only}: --model_name_or_path outputs/run/checkpoint-5 starts a new run from "
        "its weights"
    )


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


@pytest.mark.parametrize(
    ("resumed", "said", "recorded"),
    [
        (None, "nothing trained since it started, nothing to save. Stopped (exit 75). Start it again: python ",
         {"exit": 75, "step": None, "checkpoint": None, "resumed_from": None, "reached": None}),
        ("outputs/run/checkpoint-4", "nothing trained since it resumed from checkpoint-4, nothing to save. Stopped "
         "(exit 75). Continue the run: python ",
         {"exit": 75, "step": 4, "checkpoint": "outputs/run/checkpoint-4", "resumed_from": 4, "reached": 4}),
    ],
    ids=["fresh", "resumed"],
)  # fmt: skip
@pytest.mark.parametrize("early", [True, False], ids=["loading", "baseline"])
def test_a_stop_signal_before_the_first_step_stops_at_once_with_nothing_to_save(
    resumed, said, recorded, early, tmp_path, monkeypatch, capfd
):
    """While the model loads (`stop_at_once_until_training`) or the start model is measured (the trainer's callbacks
    are on, no step has begun): nothing is trained, so nothing is saved, and waiting for a first step would outlast a
    scheduler's grace period. Exit 75 and a stop record that the Slurm script reads as a requeue with nothing lost."""
    monkeypatch.setenv(stopping.STOP_RECORD_ENV, str(tmp_path / "stop.json"))
    monkeypatch.setattr(stopping, "_STOPPING", {"now": False})
    state = TrainerState(global_step=4 if resumed else 0, max_steps=10)
    trainer = fake_trainer(state)
    trainer.args.resume_from_checkpoint, trainer.args.process_index = resumed, 0
    with pytest.raises(SystemExit) as stopped:
        if early:
            stopping.stop_at_once_until_training(trainer.args)
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            with stopping.on_signals(trainer) as stop:
                stop.on_train_begin(None, state, TrainerControl())  # the baseline evaluation runs in this hook
                os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.code == stopping.EXIT_STOPPED == 75
    assert f"SIGTERM before the first step: {said}" in capfd.readouterr().err
    record = json.loads((tmp_path / "stop.json").read_text())
    assert record == {**recorded, "reason": "SIGTERM received before the first step"}
    assert signal.getsignal(signal.SIGTERM) is not stopping.StopOnSignal.receive  # the handlers put back...
    if not early:
        assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None) or callable(signal.getsignal(signal.SIGTERM))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stopping._BEFORE_TRAINING.clear()


def test_ctrl_c_before_the_first_step_stops_at_once():
    state = TrainerState(global_step=0, max_steps=10)
    with pytest.raises(KeyboardInterrupt), stopping.on_signals(fake_trainer(state)) as stop:
        stop.on_train_begin(None, state, TrainerControl())
        os.kill(os.getpid(), signal.SIGINT)


def test_a_signal_in_the_last_step_lets_the_run_finish(capfd):
    stop, control = stop_after(["SIGTERM"], step=10, max_steps=10)
    assert "the last step is done or under way, so the run finishes" in capfd.readouterr().err
    assert stop.stopped is None and not control.should_training_stop
    assert stopping.exit_code(stop) == 0  # no exit: the final evaluation and the model follow


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


def test_every_process_stops_at_the_step_where_one_of_them_got_sigterm(tmp_path):
    """A launcher or scheduler may signal one process only: the others learn it at the step's end and stop after the
    same step, so that none waits in a collective for one that left."""

    def stops_at(rank: int):
        state, control = TrainerState(global_step=0, max_steps=10), TrainerControl()
        with stopping.on_signals(fake_trainer(state)) as stop:
            stop.on_step_begin(None, state, control)
            while not control.should_training_stop and state.global_step < state.max_steps:
                if rank == 1 and state.global_step == 3:
                    os.kill(os.getpid(), signal.SIGTERM)  # during step 4, to this process only
                state.global_step += 1
                stop.on_step_end(None, state, control)
        return state.global_step, stop.stopped, control.should_save

    stopped = {"step": 4, "reason": "SIGTERM received", "saved": "checkpoint-4"}
    assert in_two_processes(stops_at, tmp_path) == [(4, stopped, True)] * 2


def test_a_stopping_step_saves_before_any_accuracy_evaluation(monkeypatch):
    """A scheduler's grace is short: the step's checkpoint comes first. The stop is the trainer's first callback, so
    the accuracy callback after it sees the run stopping and skips its evaluation; a run going on still evaluates."""

    class Measured(Exception):
        pass

    def measure(*args, **kwargs):
        raise Measured

    state = TrainerState(global_step=4, max_steps=10)
    trainer = fake_trainer(state)
    accuracy = evaluation.AccuracyCallback(
        trainer,
        [],
        grpo_demo.ANSWER_FORMAT,
        evaluation.Plan(before_and_after=False, every_steps=5, subset=8, batch_size=8),
    )
    monkeypatch.setattr(accuracy, "measure", measure)
    other = TrainerCallback()
    trainer.callback_handler = CallbackHandler([other, accuracy], None, None, None, None)  # the trainer calls them so
    args = SimpleNamespace(output_dir="run")
    with stopping.on_signals(trainer) as stop:
        assert trainer.callback_handler.callbacks == [stop, other, accuracy]
        stop.on_step_begin(args, state, TrainerControl())
        state.global_step = 5
        with pytest.raises(Measured):  # no signal: step 5 is measured
            trainer.callback_handler.on_step_end(args, state, TrainerControl())
        os.kill(os.getpid(), signal.SIGTERM)
        control = trainer.callback_handler.on_step_end(args, state, TrainerControl())  # stopping: not measured
    assert control.should_save and control.should_training_stop


# ----------------------------------------------------------------------------------------------------------------
# A stop a launcher must read (slurm/grpo.sbatch): a step that fails after the signal, with a vLLM server


@pytest.fixture
def stop_record(tmp_path, monkeypatch):
    """Where the run writes its stop record ($GRPO_STOP_RECORD, as slurm/grpo.sbatch sets it)."""
    monkeypatch.setenv(stopping.STOP_RECORD_ENV, str(tmp_path / "stop.json"))
    return tmp_path / "stop.json"


@pytest.mark.parametrize(
    ("signalled", "server", "save_only_model", "recorded"),
    [
        (True, True, False, True),  # a preemption: the server gone mid-step after the signal
        (False, True, False, False),  # a failure, no signal
        (True, False, False, False),  # torchrun's SIGTERM after a crash: no server to lose
        (True, True, True, False),  # --save_only_model: no checkpoint resumes, so no record offers one
    ],
    ids=["server-then-signal", "no-signal", "no-server", "model-only"],
)
def test_a_step_that_fails_after_a_stop_signal_with_a_vllm_server_records_the_newest_complete_checkpoint(
    signalled, server, save_only_model, recorded, tmp_path, stop_record, monkeypatch
):
    """A preemption's SIGTERM reaches vLLM's server too, and the step in progress fails without it: the record names
    the newest complete checkpoint and the step reached (the steps after that checkpoint are lost), and the error
    goes on. A failure without a stop signal is a failure, and so is one after a signal without a server (torchrun
    sends SIGTERM to the other processes when one crashed): no record."""
    out = tmp_path / "run"
    for step in (2, 4, 6):
        (out / f"checkpoint-{step}").mkdir(parents=True)
    monkeypatch.setattr(stopping.runs, "missing_parts", lambda p: ["its weights"] if p.name == "checkpoint-6" else [])
    state = TrainerState(global_step=5, max_steps=10)
    trainer = fake_trainer(state)
    trainer.args = SimpleNamespace(
        output_dir=str(out), resume_from_checkpoint=str(out / "checkpoint-2"), save_only_model=save_only_model,
        use_vllm=server, vllm_mode="server",
    )  # fmt: skip
    with pytest.raises(ConnectionError), stopping.on_signals(trainer) as stop:
        stop.on_step_begin(None, state, TrainerControl())
        if signalled:
            os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler before the next line
        raise ConnectionError("the vLLM server is gone")
    if not recorded:
        assert not stop_record.exists()
        return
    assert json.loads(stop_record.read_text()) == {
        "exit": 1, "step": 4, "checkpoint": f"{out}/checkpoint-4", "resumed_from": 2,
        "reason": "SIGTERM received, then the step in progress failed (ConnectionError)", "reached": 5,
    }  # fmt: skip


def test_a_failure_after_a_saved_stop_keeps_its_record(tmp_path, stop_record):
    """A stop that saved its step wrote its record (exit 75): an error after it (closing the trackers) keeps it."""
    state = TrainerState(global_step=4, max_steps=10)
    trainer = fake_trainer(state)
    trainer.args = SimpleNamespace(
        output_dir=str(tmp_path / "run"), resume_from_checkpoint=None, save_only_model=False, use_vllm=True,
        vllm_mode="server",
    )  # fmt: skip
    with pytest.raises(OSError), stopping.on_signals(trainer) as stop:
        stop.on_step_begin(None, state, TrainerControl())
        os.kill(os.getpid(), signal.SIGUSR1)
        state.global_step = 5
        stop.on_step_end(None, state, TrainerControl())
        stopping.record(stop)
        raise OSError("wandb could not be closed")
    assert json.loads(stop_record.read_text()) == {
        "exit": 75, "step": 5, "checkpoint": f"{tmp_path}/run/checkpoint-5", "resumed_from": None,
        "reason": "SIGUSR1 received", "reached": 5,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("name", "save_only_model", "code", "recorded"),
    [
        ("SIGUSR1", False, 75, {"exit": 75, "step": 5, "checkpoint": "run/checkpoint-5", "resumed_from": 2,
                                "reason": "SIGUSR1 received", "reached": 5}),  # resumable: the job requeues on it
        ("SIGUSR1", True, 1, None),  # the model alone: no record says it resumes; the run exits 1, a failure
        ("SIGTERM", True, 1, None),  # a preemption's signal likewise
        ("SIGHUP", True, 1, None),  # and a closed terminal's
    ],
    ids=["resumable", "model-only-usr1", "model-only-term", "model-only-hup"],
)  # fmt: skip
def test_a_stop_under_save_only_model_leaves_no_record_that_it_resumes(
    name, save_only_model, code, recorded, stop_record
):
    """The Slurm script requeues a job on its stop record: a checkpoint of --save_only_model holds no optimizer
    state, so no retry resumes from it (it would train from step 0 again, or refuse): its stop writes none."""
    state = TrainerState(global_step=4, max_steps=10)
    trainer = fake_trainer(state, save_only_model)
    trainer.args.resume_from_checkpoint, trainer.args.output_dir = "run/checkpoint-2", "run"
    with stopping.on_signals(trainer) as stop:
        stop.on_step_begin(None, state, TrainerControl())
        os.kill(os.getpid(), getattr(signal, name))
        state.global_step = 5
        stop.on_step_end(None, state, TrainerControl())
    stopping.record(stop)  # as the recipe calls it, once the run's state is written
    assert stopping.exit_code(stop) == code
    assert (json.loads(stop_record.read_text()) if stop_record.exists() else None) == recorded


@pytest.mark.parametrize(
    ("output_dir", "resume", "checkpoint", "resumed_from"),
    [
        ("./outputs/run", None, "./outputs/run/checkpoint-3", None),  # the folder as given: the script reads it so
        ("/abs/run", "/abs/run/checkpoint-2", "/abs/run/checkpoint-3", 2),  # a resumed run: the step it started at
    ],
)
def test_the_stop_record_names_the_checkpoint_in_the_folder_as_given(
    tmp_path, monkeypatch, output_dir, resume, checkpoint, resumed_from
):
    path = tmp_path / "stop.json"
    monkeypatch.setenv(stopping.STOP_RECORD_ENV, str(path))
    args = SimpleNamespace(output_dir=output_dir, resume_from_checkpoint=resume)
    stopping.write_record(args, stopping.EXIT_STOPPED, 3, "SIGUSR1 received", reached=3)
    record = json.loads(path.read_text())
    assert (record["checkpoint"], record["resumed_from"], record["exit"]) == (checkpoint, resumed_from, 75)
