"""Reward-model scoring with any ``AutoModelForSequenceClassification`` checkpoint."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RewardModel:
    """Scores (prompt, completion) pairs: the first logit of the sequence classifier.

    Pairs are encoded as the tokenizer's text pair, so BERT-style backbones (MiniLM) see
    ``[CLS] prompt [SEP] completion [SEP]`` and decoder backbones see the concatenation.
    """

    def __init__(self, path: str, max_length: int = 512, batch_size: int = 32, threads: int | None = None) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        from raypost.models.named import resolve

        self.tok = AutoTokenizer.from_pretrained(resolve(path))
        self.model = AutoModelForSequenceClassification.from_pretrained(resolve(path), num_labels=1).eval()
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.model.config.pad_token_id = self.tok.pad_token_id
        self.max_length, self.batch_size = max_length, batch_size

    @torch.no_grad()
    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        out: list[float] = []
        for i in range(0, len(prompts), self.batch_size):
            enc = self.tok(
                list(prompts[i : i + self.batch_size]),
                list(completions[i : i + self.batch_size]),
                truncation=True,
                max_length=self.max_length,
                padding=True,
                return_tensors="pt",
            )
            out.extend(self.model(**enc).logits[:, 0].float().tolist())
        return out

    def as_reward_fn(self):
        """This model as a TRL-signature reward function."""

        def reward_model(prompts: list, completions: list, **kwargs) -> list[float]:
            return self.score([str(p) for p in prompts], [str(c) for c in completions])

        return reward_model
