"""Data: synthetic task, answer parsing, row validation and rejects, the chat template and
completion-only mask boundaries (derived by hand), packing. The Ray Data pipeline:
tests/integration/test_data_pipeline.py."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from raypost.data import IGNORE_INDEX, completion_ids, final_answer, prompt_ids, sft_example, synthetic
from raypost.data.collate import block_causal_mask, collate
from raypost.data.packing import pack_frame
from raypost.data.rows import normalize_row, qa_schema
from raypost.rewards.verifiers import accuracy_reward, answers_match
from raypost.train.batches import token_loss_sums
from tests.conftest import GSM8K


def test_synthetic_is_seeded_and_correct():
    a, b = synthetic.generate(50, seed=3), synthetic.generate(50, seed=3)
    assert a == b and a != synthetic.generate(50, seed=4)
    for row in a:  # every worked line is true arithmetic and ends in the final answer
        lines = row["answer"].splitlines()
        for line in lines[:-1]:
            lhs, rhs = line.split(" = ")
            x, op, y = lhs.split()
            assert {"+": int(x) + int(y), "-": int(x) - int(y), "*": int(x) * int(y)}[op] == int(rhs)
        assert final_answer(row["answer"]) == lines[-2].split(" = ")[1]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("a\n#### 72", "72"),
        ("#### 1,234", "1234"),
        ("x #### 3.50", "3.5"),
        ("#### -4", "-4"),
        ("no answer here", None),
        ("#### 5\nmore\n#### 6", "6"),
    ],
)
def test_final_answer(text, expected):
    assert final_answer(text) == expected


@pytest.mark.parametrize(
    "completion,gold,hit",
    [
        ("9 - 2 = 7\n#### 7", "7", True),
        ("#### 8", "7", False),
        ("#### 1,234", "1234", True),
        ("#### 7.0", "7", True),
        ("no final line 7", "7", False),
        ("#### 0.5", "1/2", True),
        ("#### 1/2", "0.5", True),
        ("#### 1/3", "0.5", False),  # math-verify
        ("#### 1/3", "1", False),
        ("#### 72 apples", "72", True),
        # gold given as GSM8K's raw `answer` column: the worked solution; its final answer counts,
        # not its first number (8)
        ("#### 7", "8 - 1 = 7\n#### 7", True),
        ("#### 8", "8 - 1 = 7\n#### 7", False),
    ],
)
def test_answers_match(completion, gold, hit):
    assert answers_match(completion, gold) is hit


def test_accuracy_reward_takes_trl_chat_completions_and_raw_gsm8k_answers():
    completions = [
        [{"role": "assistant", "content": "4 * 3 = 12\n#### 12"}],
        [{"role": "assistant", "content": "#### 4"}],
        "#### 12",
    ]
    gold = ["Ann has 4 bags of 3.\n4 * 3 = 12\n#### 12"] * 3
    assert accuracy_reward([None] * 3, completions, answer=gold) == [1.0, 0.0, 1.0]


def test_gsm8k_rows_parse():
    lines = (GSM8K / "train.jsonl").read_text().splitlines()[:50]
    rows = [qa_schema("question", "answer").parse_line(line) for line in lines]
    assert all(r["reject"] == "" for r in rows)
    first = json.loads(lines[0])
    assert rows[0]["answer"] == first["answer"].split("####")[-1].strip().replace(",", "")
    assert "<<" not in rows[0]["solution"] and rows[0]["solution"].endswith(f"#### {rows[0]['answer']}")


@pytest.mark.parametrize(
    "line,reason",
    [
        ('{"question": "q", "answer": "#### 1"', "bad JSON"),
        ('{"answer": "#### 1"}', "missing field 'question'"),
        ('{"question": "  ", "answer": "#### 1"}', "field 'question' is empty"),
        ('{"question": 5, "answer": "#### 1"}', "field 'question' is int"),
        ('{"question": "q", "answer": "no number"}', "field 'answer' has no numeric final answer"),
        ("[1, 2]", "row is list"),
    ],
)
def test_malformed_rows_are_rejected_with_reason(line, reason):
    row = qa_schema("question", "answer").parse_line(line)
    assert reason in row["reject"] and row["raw"]


def test_numeric_answer_field_accepted():
    row = normalize_row({"question": "2+2?", "answer": 4}, "question", "answer")
    assert row["reject"] == "" and row["answer"] == "4" and row["solution"] == "#### 4"


def test_chat_template_and_mask_boundaries(tiny_model):
    from raypost.models.hf import load_tokenizer

    tok = load_tokenizer(tiny_model)
    q, sol = "Ava has 3 pens.", "3 + 4 = 7\n#### 7"
    p = prompt_ids(tok, q, None)
    # By hand: the ChatML prompt ends with the assistant header and nothing else.
    assert tok.decode(p) == "<|im_start|>user\nAva has 3 pens.<|im_end|>\n<|im_start|>assistant\n"
    c = completion_ids(tok, sol)
    assert c[-1] == tok.eos_token_id and tok.decode(c) == sol + "<|im_end|>"
    # Digits are single tokens.
    assert [tok.decode([i]) for i in tok("1234", add_special_tokens=False)["input_ids"]] == ["1", "2", "3", "4"]
    ex = sft_example(p, c)
    assert ex["input_ids"] == p + c
    assert ex["labels"][: len(p)] == [IGNORE_INDEX] * len(p)  # the whole prompt is masked
    assert ex["labels"][len(p) :] == c  # the first supervised token is the answer's first, the last is EOS
    sys_p = prompt_ids(tok, q, "Be brief.")
    assert tok.decode(sys_p).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")


def test_block_causal_mask_by_hand():
    seg = torch.tensor([[1, 1, 2, 2, 0]])
    m = block_causal_mask(seg)[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]]


def test_packing_keeps_examples_apart(tiny_model):
    """Packed loss == unpacked loss == one-example-at-a-time loss."""
    from raypost.models.hf import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer(tiny_model), load_causal_lm(tiny_model)
    rows = synthetic.generate(6, seed=1)
    df = pd.DataFrame(
        {
            "id": [r["id"] for r in rows],
            "prompt_ids": [prompt_ids(tok, r["question"], None) for r in rows],
            "completion_ids": [completion_ids(tok, r["answer"]) for r in rows],
        }
    )
    packed, unpacked = pack_frame(df, 1024, True), pack_frame(df, 1024, False)
    assert len(packed) == 1 and len(unpacked) == 6
    assert packed["sample_ids"][0].split(",") == [r["id"] for r in rows]

    def loss(frame):
        b = collate(frame.to_dict("records"), tok.pad_token_id)
        with torch.no_grad():
            out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
        return token_loss_sums(out.logits, b["labels"])

    (sp, n_p), (su, n_u) = loss(packed), loss(unpacked)
    separate = 0.0
    for r in unpacked.to_dict("records"):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([r["input_ids"]])).logits
        separate += token_loss_sums(logits, torch.tensor([r["labels"]]))[0].item()
    assert n_p == n_u
    assert sp.item() == pytest.approx(su.item(), rel=1e-5)
    assert sp.item() == pytest.approx(separate, rel=1e-5)


def test_pack_respects_max_len():
    df = pd.DataFrame({"id": list("abc"), "prompt_ids": [[1] * 5] * 3, "completion_ids": [[2] * 5] * 3})
    out = pack_frame(df, 20, True)
    assert list(out["num_tokens"]) == [20, 10]
    assert out["segment_ids"][0] == [1] * 10 + [2] * 10 and out["position_ids"][0] == list(range(10)) * 2
