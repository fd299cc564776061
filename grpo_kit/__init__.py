"""Machinery behind grpo_demo.py that a reader need not see to change the recipe.

- `smoke`, `demo`: the offline presets (a tiny model and generated problems; the demo warm-starts it first).
- `evaluate`: GSM8K accuracy before, during and after training, with the rewards' own parsing.
- `checks`: settings checked before anything loads; checkpoints found for resuming.
- `record`: the run record (settings, versions, commit, hardware, data fingerprint).
- `tracking`: wandb set-up that never prompts or hangs.
- `plots`: the curves picture every run leaves.
- `merge`: a LoRA adapter merged into its base model (`python -m grpo_kit.merge`).
"""
