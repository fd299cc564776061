"""Machinery behind grpo_demo.py that a reader need not see to change the recipe. It never imports the recipe:
what it needs of it (the answer format, the rewards, the defaults) is passed in.

- `settings`, `checks`: the settings (constants < preset < YAML < command line), checked before anything loads.
- `presets`, `smoke`, `demo`: the offline presets (a tiny model and generated problems; the demo warm-starts it).
- `data`, `models`: reading GSM8K-format files; tokenizer, attention, model loading and adapter precision.
- `answer_format`, `numbers`: the interface to the recipe's format, and exact number parsing.
- `evaluation`, `generation`, `scoring`, `reports`: GSM8K accuracy before, during and after training.
- `modes`: `--eval_only` and `--ask`.
- `record`, `tracking`, `plots`: the run record, wandb set-up, the curves picture.
- `merge`: a LoRA adapter merged into its base model (`python -m grpo_kit.merge`).
- `search`: the reward-weight search, an Optuna study of recipe runs (`python -m grpo_kit.search`).
"""
