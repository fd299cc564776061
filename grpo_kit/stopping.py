"""Stopping a training run before its last step: one way, whatever asks for it.

The step in progress finishes; every process stops after the same step (a reduction at the step's end, so that none
saves while another waits in a collective), saved as a checkpoint where its weights are sound; the run writes its
state and curves, says why it stopped and what to do next, and exits with a code that tells a script the same
(`EXIT_*`). Non-finite values are `health.py`'s to stop on; SIGTERM, SIGUSR1 (a scheduler before a time limit or
preemption; `kill`), SIGHUP (a closed terminal, a lost ssh connection) and Ctrl-C are `on_signals`'s (README.md).
Before the first step nothing is trained, so nothing is saved: the run stops at once (`stop_at_once_until_training`)."""

import json
import logging
import os
import select
import signal
import sys
import threading
from contextlib import contextmanager, suppress

import torch
from transformers import TrainerCallback

from grpo_kit import layout, runs

logger = logging.getLogger("grpo_demo")

EXIT_NOT_FINITE = 3  # a run stopped on a non-finite loss or gradient: neither success (0) nor a crash (1)
EXIT_STOPPED = 75  # stopped on SIGTERM, SIGUSR1 or SIGHUP with a checkpoint of its step: resume it (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130  # Ctrl-C, the shells' 128 + SIGINT
EXIT_NOT_RESUMABLE = 1  # what a stop that would exit 75 exits with under --save_only_model: no retry resumes it
MODEL_ONLY = (
    "--save_only_model true: checkpoints hold the model alone, no optimizer state, so a stopped or crashed run cannot "
    "be resumed"
)
SIGNALS = ("SIGTERM", "SIGUSR1", "SIGHUP", "SIGINT")  # the order of the flags every process reduces
# Where a launcher that cannot read the processes' exit codes (torchrun exits 1 whatever they exit with) asks to be
# told of a resumable stop: slurm/grpo.sbatch sets it. The main process writes a JSON object there (`write_record`).
STOP_RECORD_ENV = "GRPO_STOP_RECORD"


_BEFORE_TRAINING: dict[int, object] = {}  # the handlers `stop_at_once_until_training` replaced, by signal number
_STOPPING = {"now": False}  # a stop before the first step is under way in this process


def _handle(names, handler) -> dict:
    """`handler` set for each signal of `names` that the process does not ignore (one ignored at start stays ignored,
    as Python leaves an ignored Ctrl-C): {number: the handler it replaced}. Only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    numbers = [number for name in names if (number := getattr(signal, name, None))]  # no SIGUSR1, SIGHUP on Windows
    return {n: signal.signal(n, handler) for n in numbers if signal.getsignal(n) is not signal.SIG_IGN}


def stop_at_once_until_training(args) -> None:
    """Until the trainer's first step, SIGTERM, SIGUSR1 and SIGHUP stop the run at once (loading and a 1,319-question
    baseline take minutes, a scheduler's grace period less), by SystemExit: every `finally` on the way out runs.
    `on_signals` takes over and restores the handlers this replaced; Ctrl-C keeps Python's own (exit 130)."""

    def stop(signum, frame):
        before_first_step(args, signal.Signals(signum).name)

    for number, handler in _handle(SIGNALS[:-1], stop).items():
        _BEFORE_TRAINING.setdefault(number, handler)


def before_first_step(args, name: str, main: bool | None = None) -> None:
    """Stop on signal `name` before the first step: said, the stop record written (the newest checkpoint is the one
    the run resumed from, or none: nothing lost, nothing new), then SystemExit(EXIT_STOPPED)."""
    if _STOPPING["now"]:
        return  # the same request again (Slurm signals every process, accelerate launch passes it on too)
    _STOPPING["now"] = True
    step = resumed_step(args)
    main = getattr(args, "process_index", 0) == 0 if main is None else main
    then = f"Start it again: {runs.resume_command()}" if step is None else f"Continue the run: {runs.resume_command()}"
    since = "it started" if step is None else f"it resumed from checkpoint-{step}"
    if main:
        say_or_detach(f"\n{name} before the first step: nothing trained since {since}, nothing to save. Stopped "
                      f"(exit {EXIT_STOPPED}). {then}\n")  # fmt: skip
        write_record(args, EXIT_STOPPED, step, f"{name} received before the first step", reached=step)
    raise SystemExit(EXIT_STOPPED)


class EarlyStop(TrainerCallback):
    """What every way of stopping early shares: `stop_here`, in a step's hook, asks the trainer to save this step (or
    not) and stop after it; `report`, once the run's state is written, says why and returns the exit code (None: not
    stopped). Under --save_only_model nothing resumes: it says so, and exits EXIT_NOT_RESUMABLE instead of 75."""

    exit_code = 1
    then = None  # what to do next, said with the stop; None: the command that continues the run
    level = logging.WARNING

    def __init__(self, trainer):
        self.trainer = trainer
        self.main = trainer.accelerator.is_main_process
        self.stopped: dict | None = None
        self.checkpoint: str | None = None  # the stop's checkpoint, where it saves one
        self.model_only = bool(getattr(trainer.args, "save_only_model", False))  # its checkpoints do not resume

    def stop_here(self, state, control, *, reason: str, save: bool, saved: str) -> None:
        control.should_save = save
        control.should_training_stop = True
        self.stopped = {"step": state.global_step, "reason": reason, "saved": saved}
        self.checkpoint = layout.checkpoint_name(state.global_step) if save else None

    def report(self) -> int | None:
        if not self.stopped:
            return None
        then, code = self.then or f"Continue the run: {runs.resume_command()}", self.exit_code
        if self.model_only:
            where = self.trainer.args.output_dir
            start = os.path.join(where, self.checkpoint) if self.checkpoint else f"the newest checkpoint in {where}"
            then = f"{MODEL_ONLY}: --model_name_or_path {start} starts a new run from its weights"
            code = EXIT_NOT_RESUMABLE if code == EXIT_STOPPED else code
        if self.main:  # self.stopped: step, reason, saved
            logger.log(self.level, "Stopped at step %d: %s. Saved: %s. %s", *self.stopped.values(), then)
        return code


def exit_code(*stops: EarlyStop) -> int:
    """The exit code of the first of `stops` that stopped the run (said), 0 where none did."""
    return next((code for stop in stops if (code := stop.report()) is not None), 0)


def record(stop: "StopOnSignal") -> None:
    """Where `stop` stopped the run resumably (exit 75), the main process writes the stop record. Every process agreed
    on that step and saved its part, and the run's last barrier follows this: no process ends (and so no launcher, srun
    --kill-on-bad-exit, stops the others) before the record is written."""
    if stop.main and stop.stopped and stop.exit_code == EXIT_STOPPED and not stop.model_only:
        step = stop.stopped["step"]
        write_record(stop.trainer.args, EXIT_STOPPED, step, stop.stopped["reason"], reached=step)


def write_record(args, code: int, step: int | None, reason: str, reached: int | None) -> None:
    """The stop record, where $GRPO_STOP_RECORD names a file: {"exit", "step", "checkpoint", "resumed_from",
    "reason", "reached"}: `step` is the newest complete checkpoint's (None: none), `resumed_from` the step this run
    resumed from (None: a fresh start; a checkpoint newer than it is progress), `reached` the step the run had
    trained to (past `step`: the steps after the checkpoint are lost)."""
    if not (path := os.environ.get(STOP_RECORD_ENV)):
        return
    # the folder as given (./outputs/run stays so)
    checkpoint = None if step is None else os.path.join(args.output_dir, layout.checkpoint_name(step))
    fields = {"exit": code, "step": step, "checkpoint": checkpoint, "resumed_from": resumed_step(args)}
    fields |= {"reason": reason, "reached": reached}
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(fields, f)
    os.replace(path + ".tmp", path)  # whole or absent: a reader never sees half of it


def resumed_step(args) -> int | None:
    """The step of the checkpoint the run resumes from (`latest` resolved as it parsed), None for a fresh start."""
    start = args.resume_from_checkpoint
    return layout.step_of(os.path.normpath(start)) if start else None


class StopOnSignal(EarlyStop):
    """`receive`, the signal handler, only notes the signal (Python runs it in the main thread, between two
    instructions); `on_step_end` reduces the notes of every process, so that all stop after the same step."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.received: str | None = None  # the first stop signal this process got
        self.phase = "start"  # then "steps" (from the first step's start), then "end" (from on_train_end)
        self.say = trainer.accelerator.is_local_main_process  # one line per machine: each has its own log

    def receive(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.phase == "start" and self.received is None:  # nothing trained yet: nothing to save, stop at once
            if name == "SIGINT":
                raise KeyboardInterrupt
            before_first_step(self.trainer.args, name, main=self.main)
            return  # the same request again, while the stop is on its way out
        if self.received is not None:
            if "SIGINT" in (name, self.received):
                raise KeyboardInterrupt  # a second Ctrl-C, or a launcher's SIGTERM on one: at once, no checkpoint
            return  # the same request again: Slurm signals every process, and accelerate launch passes it on too
        self.received = name
        say_or_detach(f"\n{self.plan(name)}\n" if self.say else "")  # every process: each writes to the terminal

    def plan(self, name: str) -> str:
        """What the run does on stop signal `name`, as said when it comes."""
        code, what = (EXIT_INTERRUPTED, "Ctrl-C") if name == "SIGINT" else (EXIT_STOPPED, name)
        code = EXIT_NOT_RESUMABLE if code == EXIT_STOPPED and self.model_only else code
        step, steps = self.trainer.state.global_step + 1, self.trainer.state.max_steps  # the step under way
        if self.phase == "end" or step >= steps:  # (before the first step, `receive` stops at once)
            line = "the last step is done or under way, so the run finishes (final evaluation, model)"
        else:
            line = f"finishing step {step} of {steps}, saving it, then stopping (exit {code})"
        return f"{what}: {line}" + ("; Ctrl-C again stops at once, without a checkpoint" if name == "SIGINT" else "")

    def on_step_begin(self, args, state, control, **kwargs):
        if self.phase == "start":  # the baseline evaluation (on_train_begin) is done: a step is under way
            self.phase = "steps"

    def on_train_end(self, args, state, control, **kwargs):
        self.phase = "end"

    def on_step_end(self, args, state, control, **kwargs):
        received = self._anywhere()  # every process, every step: the reduction is collective
        if not received or self.stopped:
            return
        names = " and ".join("Ctrl-C (SIGINT)" if name == "SIGINT" else name for name in received)
        if state.global_step >= state.max_steps:
            if self.main:
                logger.warning("%s during the last step: the run finishes", names)
            return
        self.exit_code = EXIT_INTERRUPTED if "SIGINT" in received else EXIT_STOPPED
        saved = layout.checkpoint_name(state.global_step)
        self.stop_here(state, control, reason=f"{names} received", save=True, saved=saved)

    def _anywhere(self) -> list[str]:
        """The stop signals that any process has received (one reduction, MAX over the processes' flags)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return [self.received] if self.received else []
        flags = torch.tensor([float(self.received == name) for name in SIGNALS], device=self.trainer.accelerator.device)
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        return [name for name, flag in zip(SIGNALS, flags.tolist(), strict=True) if flag]


def say_or_detach(text: str) -> None:
    """Write `text` (if any) to stderr; where stdout or stderr is gone (a hangup takes the terminal, and a pipe's
    reader such as `| tee` with it), point it at os.devnull first: the run's next lines would fail before the
    checkpoint is saved. os.write: printing to a stream the main thread is writing to raises "reentrant call"."""
    for fd in (1, 2) if hasattr(select, "poll") else ():  # stdout, stderr
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        if any(events & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, events in poll.poll(0)):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
    with suppress(OSError):  # no stderr to write to: the signal is handled all the same
        if text:
            os.write(sys.stderr.fileno(), text.encode())


@contextmanager
def on_signals(trainer):
    """Within this block SIGTERM, SIGUSR1, SIGHUP and Ctrl-C stop `trainer`'s run after the step in progress, with its
    checkpoint; the handlers before it are put back after it. With a vLLM server (which a preemption signals with the
    training), a step that fails after a stop signal leaves a stop record of the newest complete checkpoint and
    raises on. Without one a failure is a failure, even after a signal (torchrun's SIGTERM to the others when one
    process crashed): no record."""
    stop = StopOnSignal(trainer)
    if stop.model_only and stop.main:
        logger.warning("%s: SIGTERM, SIGUSR1 or SIGHUP saves the step's model and exits 1, not 75", MODEL_ONLY)
    trainer.callback_handler.callbacks.insert(0, stop)  # before the accuracy callback: a stop skips its evaluation
    previous = _handle(SIGNALS, stop.receive)
    try:
        yield stop
    except Exception as err:
        args = trainer.args
        server = getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "server"  # TRL's modes
        if stop.received and not stop.stopped and stop.main and not stop.model_only and server:
            reason = f"{stop.received} received, then the step in progress failed ({type(err).__name__})"
            complete = [p for p in layout.checkpoints(args.output_dir) if not runs.missing_parts(p)]  # resumable
            newest = layout.step_of(complete[-1]) if complete else None
            write_record(args, 1, newest, reason, reached=trainer.state.global_step)
        raise
    finally:
        for number, handler in previous.items():
            handler = _BEFORE_TRAINING.pop(number, handler)  # what was there before the start's own
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
