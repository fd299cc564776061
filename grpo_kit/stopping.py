"""Stopping a training run before its last step: one way, whatever asks for it.

The step in progress finishes; every process agrees on the step it stops at (a reduction at the step's end, so that no
process saves while another waits in a collective); a checkpoint of that step is saved where its weights are sound;
the run writes its state and curves, says why it stopped and what to do next, and exits with a code that tells a
script the same:

| asked by | checkpoint | exit code |
| --- | --- | --- |
| non-finite gradients (`health.py`) | the step's, its update skipped | 3 (`EXIT_NOT_FINITE`): see its message |
| a non-finite logged loss the gradients did not show | none, the newest is the last good one (fp16: the step's) | 3 |
| SIGTERM or SIGUSR1 (a scheduler before a time limit or preemption; kill) | the step's | 75 (`EXIT_STOPPED`): resume |
| Ctrl-C (SIGINT) | the step's | 130 (`EXIT_INTERRUPTED`) |
| Ctrl-C again, or any stop signal after a Ctrl-C | none: it stops at once | 130 |

75 is sysexits.h's EX_TEMPFAIL, "try again later": a script or scheduler that sees it resumes the run with
`--resume_from_checkpoint latest`, which continues from the checkpoint as if the run had not stopped. A repeated
SIGTERM or SIGUSR1 changes nothing (Slurm signals every process of a step, and `accelerate launch` passes the signal
on as well); after a Ctrl-C, any further stop signal ends the process at once (on a second Ctrl-C, `accelerate launch`
sends its processes SIGTERM). A signal that comes during the last step, or after it (the final evaluation, saving the
model), lets the run finish: nothing would be left to resume. Before training starts no handler is installed: the
process ends as it would without them, with nothing to save.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager

from transformers import TrainerCallback

logger = logging.getLogger("grpo_demo")

EXIT_NOT_FINITE = 3  # a run stopped on a non-finite loss or gradient: neither success (0) nor a crash (1)
EXIT_STOPPED = 75  # stopped on SIGTERM or SIGUSR1 with a checkpoint of its step: resume it (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130  # Ctrl-C, the shells' 128 + SIGINT
SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")  # the order of the flags every process reduces
RESUME = "--resume_from_checkpoint latest continues the run"


class EarlyStop(TrainerCallback):
    """What every way of stopping early shares: `stop_here`, in a step's hook, asks the trainer to save this step (or
    not) and stop after it, and records why; `exit_if_stopped`, once the run's state and curves are written (and every
    process got that far), says so and ends the process with `exit_code`."""

    exit_code = 1
    then = RESUME
    level = logging.WARNING

    def __init__(self, trainer):
        self.trainer = trainer
        self.main = trainer.accelerator.is_main_process
        self.stopped: dict | None = None

    def stop_here(self, state, control, *, reason: str, save: bool, saved: str) -> None:
        control.should_save = save
        control.should_training_stop = True
        self.stopped = {"step": state.global_step, "reason": reason, "saved": saved}

    def exit_if_stopped(self) -> None:
        """End the process with `exit_code` where the run was stopped, saying how to go on."""
        if not self.stopped:
            return
        if self.main:
            step, reason, saved = (self.stopped[key] for key in ("step", "reason", "saved"))
            logger.log(self.level, "Stopped at step %d: %s. Saved: %s. %s", step, reason, saved, self.then)
        raise SystemExit(self.exit_code)


def exit_if_stopped(*stops: EarlyStop) -> None:
    """End the process as the first of `stops` that stopped the run says (the run's files written before)."""
    for stop in stops:
        stop.exit_if_stopped()


class StopOnSignal(EarlyStop):
    """SIGTERM, SIGUSR1 and Ctrl-C: the step in progress finishes and is saved, then the run stops (module docstring).

    `receive` is the signal handler: it only notes the signal (Python runs it in the main thread, between two
    instructions); `on_step_end` reduces the notes of every process, so that all stop after the same step."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.received: str | None = None  # the first stop signal this process got
        self.phase = "start"  # then "steps" (from on_train_begin), then "end" (from on_train_end)
        self.say = trainer.accelerator.is_local_main_process  # one line per machine: each has its own log

    def receive(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            if "SIGINT" in (name, self.received):
                raise KeyboardInterrupt  # a second Ctrl-C, or a launcher's SIGTERM on one: at once, no checkpoint
            return  # the same request again
        self.received = name
        if self.say:
            # os.write, not print or logging: a handler writing to a buffered stream that the main thread is in the
            # middle of writing to raises "reentrant call".
            os.write(sys.stderr.fileno(), f"\n{self.plan(name)}\n".encode())

    def plan(self, name: str) -> str:
        """What the run does on stop signal `name`, as said when it comes."""
        state, code = self.trainer.state, EXIT_INTERRUPTED if name == "SIGINT" else EXIT_STOPPED
        what = "Ctrl-C" if name == "SIGINT" else name
        if self.phase == "start":
            line = f"{what}: stopping after the first step this run trains, with its checkpoint (exit {code})"
        elif self.phase == "end" or state.global_step + 1 >= state.max_steps:
            line = f"{what}: the last step is done or under way, so the run finishes (final evaluation, model)"
        else:
            line = f"{what}: finishing step {state.global_step + 1} of {state.max_steps}, saving it, then stopping "
            line += f"(exit {code})"
        return line + ("; Ctrl-C again stops at once, without a checkpoint" if name == "SIGINT" else "")

    def on_train_begin(self, args, state, control, **kwargs):
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
        self.stop_here(state, control, reason=f"{names} received", save=True, saved=f"checkpoint-{state.global_step}")

    def _anywhere(self) -> list[str]:
        """The stop signals that any process has received (one reduction, MAX over the processes' flags)."""
        import torch

        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return [self.received] if self.received else []
        flags = torch.tensor([float(self.received == name) for name in SIGNALS], device=self.trainer.accelerator.device)
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        return [name for name, flag in zip(SIGNALS, flags.tolist(), strict=True) if flag]


@contextmanager
def on_signals(trainer):
    """Within this block SIGTERM, SIGUSR1 and Ctrl-C stop `trainer`'s run after the step in progress, with its
    checkpoint (see the module docstring); the handlers before it are put back after it. A signal the process was
    started ignoring (nohup, a shell's background job) stays ignored, as Python leaves an ignored Ctrl-C."""
    stop = StopOnSignal(trainer)
    trainer.callback_handler.callbacks.insert(0, stop)  # before the accuracy callback: a stop skips its evaluation
    previous = {}
    if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
        for name in SIGNALS:
            number = getattr(signal, name, None)  # no SIGUSR1 on Windows
            if number is not None and signal.getsignal(number) is not signal.SIG_IGN:
                previous[number] = signal.signal(number, stop.receive)
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
