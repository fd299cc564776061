"""The recipe's settings, parsed once: its constants are defaults, a preset (`--smoke`, `--demo`) sits on them, a
YAML file (`--config`) on that, and the command line wins; then checked (`grpo_kit.checks`) before anything is
loaded, and the values derived from them set (the checkpoint to resume, the attention that can run, offline mode).
Any field of `RunArguments` (below), TRL's `GRPOConfig` or `ModelConfig` can be set either way. The YAML is read here,
not by TRL, so that every value can be checked before a dataclass or model is built; its `env:` block sets the
variables of `runs.CONFIG_ENV` alone, before the libraries that read them are imported. Each default is declared
once: the recipe's constants, passed in."""

import argparse
import dataclasses
import logging
import os
import re
import shlex
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grpo_kit import RecipeError, checks, console, layout, models, online, presets, runs
from grpo_kit.smoke import TINY_MODELS

logger = logging.getLogger("grpo_demo")

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LAUNCHER_VARIABLES = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
MAX_YAML_VALUES = 100_000  # a settings file holds hundreds; aliases expanding past this are a "billion laughs"
# GRPOConfig's fields that take a mapping (generation_kwargs, model_init_kwargs, ...): the only YAML mappings read.
MAPPING_SETTINGS = {
    "lr_scheduler_kwargs", "activation_checkpointing_kwargs", "gradient_checkpointing_kwargs", "liger_kernel_config",
    "accelerator_config", "fsdp_config", "deepspeed", "model_init_kwargs", "generation_kwargs", "chat_template_kwargs",
    "transformers_continuous_batching_config",
}  # fmt: skip


def _option(default, help_text: str, **metadata):
    """A field of `RunArguments` with its --help text (a list default: a fresh copy for each instance)."""
    value = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(**value, metadata={"help": help_text, **metadata})


@dataclass
class RunArguments:
    """What to run, on which data, and how to measure it."""

    dataset: str | None = _option(
        None, "Folder with GSM8K's train.jsonl/test.jsonl, or the Hub's main/*.parquet; default: the Hub's openai/gsm8k"
    )
    # The recipe's constants give these their defaults (MAX_PROMPT_TOKENS, REASONING_TAG, ANSWER_TAG).
    max_prompt_tokens: int = _option(None, "Longer prompts are dropped")
    reasoning_tag: str = _option(
        None, "The reasoning block's tag, in prompt, rewards and evaluation alike (think: <think>)"
    )
    answer_tag: str = _option(None, "The answer block's tag (<answer>...</answer>)")
    validation_rows: int = _option(
        0, "Train rows held out as a validation split (a fixed draw, whatever the seed), never trained on"
    )
    strict_data: bool = _option(False, "Stop on a bad data row instead of dropping it (and saying so)")
    # The recipe's constants give these their defaults (WARM_START_ROWS, WARM_START_LEARNING_RATE).
    warm_start_rows: int = _option(None, "Fine-tune on N train solutions in the answer format before GRPO; 0: none")
    warm_start_learning_rate: float = _option(None, "The warm start's learning rate")
    smoke: bool = _option(False, "Offline CPU check: tiny generated model and problems, a few steps")
    demo: bool = _option(
        False, "Offline CPU demo, ~2 min: GRPO raises a tiny warm-started model's accuracy (curves.png)"
    )
    tiny_model: str = _option(
        TINY_MODELS[0],
        "--smoke/--demo: the tiny model's architecture and chat conventions, qwen2 (Qwen2.5's ChatML) or "
        "llama3 (a Llama model with Llama 3's chat template and special tokens)",
        choices=list(TINY_MODELS),
    )
    # GSM8K test accuracy: greedy, max_completion_length new tokens, scored strict (answer block) and lenient
    eval_only: bool = _option(False, "Evaluate --model_name_or_path on the test split into <output_dir>/eval/ and exit")
    final_eval: bool = _option(True, "Evaluate the start model before training and the trained one after it")
    eval_every_steps: int = _option(50, "Accuracy on eval_subset test questions every N steps, logged; 0: off")
    eval_subset: int = _option(100, "The first N test questions, for eval_every_steps")
    eval_split: str = _option(
        "test",
        "What the accuracy evaluations measure: test, or validation (the rows --validation_rows holds out "
        "of train: for tuning, so that the test split stays unseen)",
        choices=["test", "validation"],
    )
    eval_limit: int | None = _option(None, "Evaluate the first N test questions; default: all")
    eval_batch_size: int = _option(
        64,
        "Questions generated together, per process; with eval_samples, completions (batch_size // "
        "eval_samples questions, at least one)",
    )
    eval_protocols: list[str] = _option(
        ["recipe"],
        "How questions are put and answers read: recipe (its format, zero-shot), chat (the question alone; "
        "\\boxed{} or the last number) (grpo_kit/scoring.py); lm-evaluation-harness's own tasks, run by lm-eval: "
        "gsm8k (5-shot), gsm8k_cot (8-shot CoT), each with -chat for the chat template (grpo_kit/harness.py, "
        "docs/evaluation.md). Baseline and final run in each; a training run always in recipe",
    )
    eval_max_gen_toks: int | None = _option(
        None, "lm-eval's max_gen_toks for its tasks (--gen_kwargs max_gen_toks=N); default: lm-eval's, 256"
    )
    eval_samples: int = _option(0, "Samples per question for pass@k and maj@k, beside greedy accuracy; 0: off")
    eval_temperature: float | None = _option(None, "The temperature of eval_samples; default: the training temperature")
    ask: str | None = _option(None, "Print a sampled answer of --model_name_or_path to this question and exit")
    show_completions: bool = _option(
        False, "Print the sampled completions table at each logged step (always in <output_dir>/completions/, wandb)"
    )
    health_checks_off: list[str] = _option(
        [],
        "Training-health checks to leave off (grpo_kit/health.py): truncation, no_signal, format_only, "
        "length_runaway, entropy_collapse, not_learning, not_finite; or all",
    )
    allow_changed_settings: bool = _option(
        False, "Resume even where settings differ from the run's start (learning rate, batch, model...)"
    )
    memory_plan: bool = _option(
        True,
        "On a GPU, stop before loading when the estimated peak memory exceeds the GPU's (docs/memory.md), saying "
        "what fits; false: load anyway (the estimate is rough, within a fifth)",
    )


def read_config(argv: list[str], apply_env: bool = True) -> tuple[list[str], dict, Path | None]:
    """Split `--config FILE` off the command line: the rest of it, the YAML's values (its `env:` applied; with
    `apply_env` false kept among them instead), and the file's path."""
    argv = [part for arg in argv for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]
    if "--config" not in argv:
        return argv, {}, None
    if argv.count("--config") > 1:
        raise RecipeError("--config is given twice: one YAML file, then the command line for what differs")
    i = argv.index("--config")
    if i + 1 >= len(argv):
        raise RecipeError("--config needs a YAML file: --config recipe.yaml")
    if not (path := Path(argv[i + 1])).is_file():
        raise RecipeError(f"--config {path}: no such file")
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(path.read_text(encoding="utf-8"))  # libyaml: faster
        try:
            node = loader.get_single_node()  # aliases not yet expanded: a 400-byte file can stand for 10**9 values
            if node is not None and (n := _expanded(node)) > MAX_YAML_VALUES:
                raise RecipeError(
                    f"--config {path}: its aliases (*name) expand to {n:,} values, and a settings file holds "
                    f"hundreds: write the settings out (at most {MAX_YAML_VALUES:,} values)"
                )
            values = (loader.construct_document(node) if node is not None else None) or {}
        finally:
            loader.dispose()
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise RecipeError(f"--config {path}: not a readable YAML file ({str(err).splitlines()[0]})") from None
    if not isinstance(values, dict):
        raise RecipeError(f"--config {path}: expected a mapping of setting: value")
    if "config" in values:
        raise RecipeError(f"--config {path}: a config: inside a config file is not read: put its settings here")
    env = values.pop("env", None) or {}
    if not isinstance(env, dict):
        raise RecipeError(f"--config {path}: env: expected a mapping of VARIABLE: value")
    for key, value in env.items():
        if not ENV_NAME_RE.fullmatch(str(key)) or "\0" in str(value):
            raise RecipeError(f"--config {path}: env: {key!r}: {value!r} is not an environment variable and value")
        if key in LAUNCHER_VARIABLES:
            raise RecipeError(
                f"--config {path}: env: {key} is set by accelerate launch / torchrun, not by a config file"
            )
        if isinstance(value, (bool, dict, list)):
            raise RecipeError(
                f"--config {path}: env: {key}: {value!r} is not a text value (YAML reads yes/no/on/off/true as a "
                f'boolean): quote it, e.g. {key}: "1"'
            )
        if key not in runs.CONFIG_ENV:
            raise RecipeError(
                f"--config {path}: env: {key} is not one a config file sets: set it in the shell instead "
                f"({key}=... python {Path(sys.argv[0]).name} ...). A file's env: sets "
                + ", ".join(sorted(runs.CONFIG_ENV))
            )
        if apply_env and value is not None:  # null: left as the shell has it
            os.environ[str(key)] = str(value)
    if env and not apply_env:
        values["env"] = env  # kept, unapplied, for a file written from these values
    return argv[:i] + argv[i + 2 :], values, path


def _expanded(root) -> int:
    """How many values a YAML node stands for once its aliases are expanded (an alias counts its anchor's each time);
    without recursion, so that nesting as deep as the parser reads is counted too."""
    sizes, stack = {}, [(root, False)]
    while stack:
        node, counted = stack.pop()
        children = node.value if isinstance(node, yaml.SequenceNode) else ()
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        if counted:  # its children are
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
        elif id(node) not in sizes:
            sizes[id(node)] = 1  # until counted: a node inside itself (a recursive anchor) counts once
            stack += [(node, True), *((child, False) for child in children)]
    return sizes[id(root)]


def yaml_arguments(parser, values: dict, path: Path | None) -> tuple[list[str], dict, list[str]]:
    """(command-line tokens, mappings to set directly such as `generation_kwargs`, unknown keys) of a YAML file's
    settings, so that its values are typed and checked by the command line's parser; `null` means the default."""
    actions = {action.dest: action for action in parser._actions}
    tokens, direct, unknown = [], {}, []
    for key, value in values.items():
        if (action := actions.get(key)) is None:
            unknown.append(key)
        elif isinstance(value, dict) and key in MAPPING_SETTINGS:
            direct[key] = value
        elif isinstance(value, dict) or key in MAPPING_SETTINGS:
            kind = "a mapping" if isinstance(value, dict) else type(value).__name__
            wanted = "a mapping (key: value lines under it)" if key in MAPPING_SETTINGS else "one value"
            raise RecipeError(f"--config {path}: {key}: {kind} given, it takes {wanted}")
        elif isinstance(value, list) and (action.nargs not in ("+", "*") or not value):
            takes = "one or more values, not an empty list" if value == [] else "one value, not a list"
            raise RecipeError(f"--config {path}: {key}: {value}: it takes {takes}")
        elif value is not None:  # null: the default, as if the line were not there
            items = value if isinstance(value, list) else [value]
            if any(isinstance(x, str) and x.startswith("--") for x in items):  # it would be read as another setting
                raise RecipeError(f"--config {path}: {key}: {value}: a value cannot start with --")
            tokens += [f"--{key}", *(str(x).lower() if isinstance(x, bool) else str(x) for x in items)]
    return tokens, direct, unknown


RESUME_HELP = (
    "latest (or true): the newest complete checkpoint-N in --output_dir; or a checkpoint folder. Checked before "
    "anything loads: its weights, optimizer, scheduler, RNG and trainer state are whole (a cut one is skipped), and "
    "the run's settings and training data are the ones its start recorded (else refused, naming what changed; "
    "--allow_changed_settings true resumes anyway)"
)
# The settings people change first, with the short text `--help` shows (the full list: --help-all)
FIRST_SETTINGS = {
    "config": "A YAML file of settings (any of --help-all's); the command line wins over it",
    "smoke": None,
    "demo": None,
    "model_name_or_path": "The model to train (a Hub name or a local folder)",
    "dataset": None,
    "output_dir": "Where checkpoints, the model, curves, evaluations and the run record go",
    "resume_from_checkpoint": RESUME_HELP,
    "max_steps": "Optimizer steps to train; -1: num_train_epochs over the data",
    "learning_rate": "AdamW's peak learning rate (cosine schedule, 10 % warmup)",
    "num_generations": "Completions sampled per prompt: the group whose rewards GRPO normalises",
    "per_device_train_batch_size": "Completions per device per micro-step (x gradient_accumulation_steps x processes: "
    "a multiple of num_generations)",
    "gradient_accumulation_steps": "Micro-steps per optimizer step",
    "max_completion_length": "Tokens a completion may run to before it is cut",
    "temperature": "Sampling temperature of the rollouts",
    "loss_type": "The objective's normalisation: dapo, grpo, dr_grpo, bnpo... (README: Objectives)",
    "beta": "KL penalty towards the start model; 0: none, and no reference model in memory",
    "use_peft": "Train LoRA adapters (lora_r, lora_alpha); with --load_in_4bit: QLoRA on CUDA",
    "use_vllm": "Generate rollouts with vLLM (requirements-gpu.txt)",
    "report_to": "Where metrics go: wandb, none...",
}


def _parser(config: Path | None = None):
    from trl import GRPOConfig, ModelConfig, TrlParser

    parser = TrlParser((RunArguments, GRPOConfig, ModelConfig))
    parser.allow_abbrev = False  # --conf is not --config, --lr not --lr_scheduler_type: every name is given whole
    where = f" (on the command line or in {config})" if config else ""

    def error(message: str):  # argparse's own prints the whole usage first: hundreds of lines
        message = message.rstrip(".")  # transformers' boolean parser ends its own with one
        raise RecipeError(f"Invalid setting{where}: {message}. python {Path(sys.argv[0]).name} --help lists them all")

    parser.error = error
    # Read (and taken off the command line) by read_config; listed here for --help.
    parser.add_argument("--config", help=FIRST_SETTINGS["config"])
    for action in parser._actions:  # transformers' texts for these say nothing of what the recipe does with them
        if action.dest == "resume_from_checkpoint":
            action.help = RESUME_HELP
        elif "--no_final_eval" in action.option_strings:
            action.help = "Skip the baseline and final evaluations (as --final_eval false)"
    return parser


def short_help(parser) -> str:
    """`--help`: the settings people change first, then the recipe's own, each with its default (the recipe's,
    or the preset's when one is given); the rest (TRL's GRPOConfig, ModelConfig) named by --help-all."""
    # the first of a dest: --final_eval, not its --no_final_eval
    actions = {action.dest: action for action in reversed(parser._actions) if action.option_strings}
    recipe = [f.name for f in dataclasses.fields(RunArguments) if f.name not in FIRST_SETTINGS]
    script = Path(sys.argv[0]).name

    def line(dest: str, text: str | None) -> list[str]:
        default = parser.get_default(dest)
        if isinstance(default, (bool, list)):  # as they are typed: --use_peft true, --report_to wandb none
            default = " ".join(map(str, default)) if isinstance(default, list) else str(default).lower()
        shown = "" if default in (None, "") or dest == "config" else f" [{default}]"
        head = f"  --{dest}{shown}"
        body = textwrap.wrap(text or actions[dest].help or "", 118 - 34) or [""]
        first = f"{head:<34}{body[0]}" if len(head) < 34 else f"{head}\n{'':34}{body[0]}"
        return [first, *(f"{'':34}{rest}" for rest in body[1:])]

    lines = [f"python {script} [--config FILE] [--smoke | --demo] [--setting value ...]", "", "Start here:"]
    lines += [row for dest, text in FIRST_SETTINGS.items() for row in line(dest, text)]
    lines += ["", "The recipe's evaluation, data and checks:", *[row for dest in recipe for row in line(dest, None)]]
    rest = len(actions) - len(FIRST_SETTINGS) - len(recipe) - 1  # less -h
    lines += [
        "",
        f"Every other GRPOConfig / TrainingArguments / ModelConfig field ({rest} more) is a setting too: "
        f"python {script} --help-all",
    ]
    return "\n".join(lines)


def answer_help(parser, argv: list[str]) -> list[str]:
    """`--help`: the short help, then exit; `--help-all`: argparse's own `--help` (every field, with TRL's texts)."""
    if "--help-all" in argv:
        return ["--help" if arg == "--help-all" else arg for arg in argv]
    if "-h" in argv or "--help" in argv:
        try:
            print(short_help(parser), flush=True)
        except BrokenPipeError:  # `--help | head`: the reader has its lines and closed the pipe (argparse's own way)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # and exit's flush finds no pipe either
        sys.exit(0)
    return argv


def given_on_command_line(argv: list[str], unknown: list | None = None) -> dict:
    """The settings the command line names, typed (values for everything else are left out); what it does not know
    (a misspelt or abbreviated name, and what follows it) is added to `unknown`."""
    parser = _parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    given, rest = parser.parse_known_args([a for a in argv if a not in ("-h", "--help", "--help-all")])
    (unknown if unknown is not None else []).extend(rest)
    return vars(given)


def machine_defaults(recipe_defaults: dict, chosen: dict, preset: str | None, config: Path | None) -> dict:
    """The recipe's defaults with this machine's precision, the preset's settings, and the output folder and run name
    of the model chosen (wherever it was chosen; a preset names its own)."""
    import torch

    cuda = torch.cuda.is_available()
    native_bf16 = cuda and torch.cuda.is_bf16_supported(including_emulation=False)  # Ampere or newer
    defaults = {
        **recipe_defaults,
        # bf16 compute (autocast) on a GPU that has it (or fp16 when asked); the weights' dtype is the recipe's
        # choice (dtype None). Older GPUs compute in fp32 unless --fp16 true.
        "bf16": native_bf16 and not chosen.get("fp16"),
        "use_cpu": not cuda,  # also makes `accelerate launch` processes on a CPU-only machine join one gloo group
        "dtype": None,
        # TRL's default (True), under transformers' name: its old one, gradient_checkpointing, warns on every run
        "activation_checkpointing": chosen.get("gradient_checkpointing", True),
        # a preset's run of a --config file gets a folder of its own: outputs/demo-gspo-GRPO
        **(presets.defaults(preset, chosen.get("tiny_model"), config and config.stem) if preset else {}),
    }
    if cuda and not native_bf16 and not (chosen.get("fp16") or chosen.get("bf16")):
        logger.warning("This GPU has no native bf16: training computes in fp32 (slow); --fp16 true for fp16 autocast")
    return {**layout.default_names(chosen.get("model_name_or_path", defaults["model_name_or_path"])), **defaults}


def beside_the_model(values: dict, own: dict) -> str:
    """Where `--eval_only` writes when no --output_dir is given: beside the model it measures, a run's checkpoint's in
    the run's folder (eval/checkpoint-N), not inside the checkpoint, which the run's rotation deletes."""
    model_dir = Path(values["model_name_or_path"]).expanduser()
    if not model_dir.is_dir() or values["model_name_or_path"] in own.get("model_name_or_path", ()):
        return values["output_dir"]
    run = layout.run_of(model_dir)
    in_a_run = (
        run != model_dir
        and layout.path(model_dir, layout.STATE).is_file()
        and layout.path(run, layout.RECORD).is_file()
    )
    return str(run if in_a_run else model_dir)


def resolve(argv: list[str] | None, recipe_defaults: dict, reward_funcs: list, roles: dict | None = None) -> dict:
    """Every setting's value from the recipe's defaults, a preset, `--config` YAML and the command line, in that
    order, checked: stops with one line per problem before anything is loaded."""
    logging.basicConfig(  # info from the main process, warnings only from the others; above the progress bar
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING,
        handlers=[console.TqdmHandler()],
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    # A byte that is not UTF-8 reaches Python's argv as a lone surrogate (surrogateescape): named as bytes.
    if bad := [arg for arg in argv if re.search(r"[\ud800-\udfff]", arg)]:
        raise RecipeError(f"Invalid setting: {bad[0].encode('utf-8', 'surrogateescape')!r} is not UTF-8 text")
    argv, yaml_values, config = read_config(argv)  # its env: first, before torch, trl or the Hub's libraries load
    console.quiet_libraries()
    chosen = {k: v for k, v in {**yaml_values, **given_on_command_line(argv)}.items() if v is not None}
    preset = presets.chosen(chosen)
    defaults = machine_defaults(recipe_defaults, chosen, preset, config)
    parser = _parser(config)
    tokens, direct, unknown = yaml_arguments(parser, yaml_values, config)  # typed like the command line's
    parser.set_defaults(**{**defaults, **direct})
    argv = answer_help(parser, argv)
    namespace, unknown_cli = parser.parse_known_args(tokens + argv)  # the command line's come last: they win
    if config and {"compute_environment", "distributed_type"} <= set(unknown):  # configs/zero3.yaml, ddp.yaml...
        raise RecipeError(
            f"{config} is an accelerate config (how processes launch), not the recipe's settings: "
            f"accelerate launch --config_file {config} {Path(sys.argv[0]).name} {shlex.join(argv)}".rstrip()
        )
    where = ((f"in {config}", unknown), ("on the command line", unknown_cli))
    if found := [f"{place}: {runs.public(names)}" for place, names in where if names]:
        raise RecipeError(f"Unknown settings {'; '.join(found)} (python {Path(sys.argv[0]).name} --help lists them)")
    values = {key: value for key, value in vars(namespace).items() if key != "config"}
    if (scale := str(values.get("scale_rewards")).lower()) in ("true", "false"):  # TRL's booleans, read as text here
        values["scale_rewards"] = "group" if scale == "true" else "none"
    values.update(presets.keyed(preset, values))  # its assets' folders, of the tags and seed they are built on
    asks = values["ask"] is not None or values["eval_only"]
    if asks and "model_name_or_path" not in chosen and (trained := presets.trained_model(preset, values)):
        values["model_name_or_path"] = trained  # --demo --ask: the model the demo trained, not its start model
    if asks and preset and "model_name_or_path" not in chosen:
        logger.info(
            "--%s %s: %s", preset, "--ask" if values["ask"] is not None else "--eval_only",
            f"the model --{preset} trained, in {trained}" if trained else
            f"the start model (no trained one in {values['output_dir']} yet: --{preset} trains it there)",
        )  # fmt: skip
    own = presets.owned(preset, values)
    if values["eval_only"] and "output_dir" not in chosen:
        values["output_dir"] = beside_the_model(values, own)
    found = checks.problems(values, n_rewards=len(reward_funcs), own=own)
    found += [] if roles is None else list(checks.reward_roles(reward_funcs, roles))  # the recipe's own: declared
    if found:
        raise RecipeError("Invalid settings:", found)
    for warning in checks.warnings(values):
        logger.warning(warning)
    values["resume_from_checkpoint"] = runs.resume(values)
    half = values["bf16"] or values["fp16"] or values["dtype"] in ("bfloat16", "float16")
    values["attn_implementation"] = models.attention(values["attn_implementation"], values["use_cpu"], half)
    online.go_offline_if_unreachable(values)
    return values


def built(values: dict):
    """(RunArguments, GRPOConfig, ModelConfig) of `values`. What TRL's and transformers' own checks refuse as the
    objects are built (`__post_init__`: batch arithmetic, settings that exclude each other, a setting another needs)
    is said as the recipe's message, with the settings it names and their values: their rules, not a copy of them."""
    try:
        return _parser().parse_dict(values)
    except (ValueError, TypeError, ImportError) as err:
        said = str(err).strip().rstrip(".")
        named = [n for n in values if len(n) > 2 and re.search(rf"(?<![A-Za-z_]){re.escape(n)}(?![A-Za-z_])", said)]
        given = ", ".join(" ".join(runs.public([f"--{n}", str(values[n])])) for n in named)
        raise RecipeError(
            f"Invalid settings: {said}" + (f" (here: {given})" if given else "") + f". python {Path(sys.argv[0]).name} "
            "--help-all says what each one does"
        ) from None


def parse(argv: list[str] | None, recipe_defaults: dict, reward_funcs: list, roles: dict | None = None):
    """(RunArguments, GRPOConfig, ModelConfig) of `resolve`'s values."""
    values = resolve(argv, recipe_defaults, reward_funcs, roles)  # first: a config's env: is set before trl is imported
    run, training_args, model_args = built(values)
    if training_args.hub_token:  # huggingface_hub reads HF_TOKEN: pushes work, and the Trainer's pickled arguments
        os.environ.setdefault("HF_TOKEN", training_args.hub_token)  # (training_args.bin in every checkpoint)
        training_args.hub_token = None  # hold no token
    if argv is None:  # what wandb records as the run's arguments, and every command printed from here on
        sys.argv[:] = runs.public(sys.argv)
    if isinstance(model_args.lora_target_modules, str) and model_args.lora_target_modules != "all-linear":
        # ModelConfig turns a list of one into a string, which PEFT reads as a pattern of whole module paths.
        model_args.lora_target_modules = [model_args.lora_target_modules]
    if training_args.resume_from_checkpoint:
        logger.info("Resuming from %s", training_args.resume_from_checkpoint)
    return run, training_args, model_args
