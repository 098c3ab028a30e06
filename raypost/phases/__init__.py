"""The phases a pipeline runs, in order: data + model, SFT, (GRPO), evaluation, report."""
