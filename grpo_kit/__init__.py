"""Machinery behind grpo_demo.py that a reader need not see to change the recipe.

- `smoke`: the offline preset: generated GSM8K-format problems and a tiny Qwen2 model built on the spot.
- `tracking`: wandb set-up that never prompts or hangs.
"""
