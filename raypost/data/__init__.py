"""Ray Data preprocessing: sources, validation with rejects, chat template, tokenization, packing."""

from raypost.data.answers import final_answer, normalize_number
from raypost.data.preprocess import DataError, SplitCounts, read_splits, sft_rows, split_rejects, tokenize
from raypost.data.tokenize import IGNORE_INDEX, completion_ids, prompt_ids, sft_example

__all__ = ["final_answer", "normalize_number", "DataError", "SplitCounts", "read_splits", "sft_rows",
           "split_rejects", "tokenize", "IGNORE_INDEX", "completion_ids", "prompt_ids", "sft_example"]
