"""Machinery behind grpo_demo.py that a reader need not see to change the recipe. It never imports the recipe:
what it needs of it (the answer format, the rewards and their roles, the defaults) is passed in. Its modules stand on
floors by when their code runs, each importing only from its floor or below (docs/ARCHITECTURE.md). One job a module:

- `settings`: the settings, parsed once (constants < preset < YAML < command line); `checks`: refusing, before
  anything loads, what could not run; `presets`: the offline presets' settings, and building their assets.
- `smoke`, `demo`: the offline assets: tiny models and generated problems; the demo's warm start.
- `data`: GSM8K-format splits, and which a run reads; `answer_format`, `numbers`: the recipe's format, exact numbers.
- `layout`: the output folder, every path in it; `patches`: every patch of a library's functions or objects, naming
  the upstream behaviour it answers.
- `models`: this machine's GPUs and packages, the tokenizer, attention, loading; `generation`: completions.
- `evaluation`: GSM8K accuracy before, during and after training, `--eval_only` and `--ask`; `scoring`: how an
  answer is read and counted (protocols, intervals, pass@k); `harness`: lm-evaluation-harness's own gsm8k tasks,
  run by lm-eval; `reports`: evaluations on disk and their tables.
- `runs`: a run's life in its folder (lock, record, checkpoints, resume); `stopping`: stopping early on a signal;
  `health`: the training-health watcher; `plots`: curves.png; `online`: the Hub and wandb, reachable or not.
- `warm_start`: the supervised warm start on the answer format, before GRPO (`--warm_start_rows`).
- `merge`: a LoRA adapter merged into its base (`python -m grpo_kit.merge`); `search`: the reward-weight search, an
  Optuna study of recipe runs (`python -m grpo_kit.search`).

The kit raises `RecipeError` for what a user can fix; only the entry points turn it into a message and an exit code."""

import shlex
import sys


class RecipeError(Exception):
    """A problem the user can fix, its message saying how; `problems`: several under one heading, a line each."""

    def __init__(self, message: str, problems: list[str] | tuple[str, ...] = ()):
        self.problems = list(problems)
        super().__init__(message + "".join(f"\n  - {problem}" for problem in self.problems))


def offline_commands() -> str:
    """The two runs that need no Hub, as commands this process's recipe runs as pasted (`python <script> --smoke`)."""
    script = shlex.quote(sys.argv[0] or "grpo_demo.py")
    return f"python {script} --smoke (the whole recipe, seconds) or python {script} --demo (GRPO learning, ~2 min)"
