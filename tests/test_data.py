"""Data: synthetic task, answer parsing, row validation and rejects, the chat template and
completion-only mask boundaries (derived by hand), packing, and the Ray Data pipeline."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from raypost.config import DataConfig
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


def test_pipeline_counts_and_writes_rejects(ray_cluster, tiny_model, tmp_path):
    from raypost.data import preprocess

    good = [{"question": f"q{i} has 3 pens", "answer": f"3 + {i} = {3 + i}\n#### {3 + i}"} for i in range(20)]
    lines = [json.dumps(r) for r in good] + [
        "{not json",
        json.dumps({"question": "x"}),
        json.dumps({"question": "", "answer": "#### 1"}),
        json.dumps({"question": "long " * 400, "answer": "#### 1"}),
    ]
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(lines) + "\n")
    cfg = DataConfig(path=str(f), max_seq_len=128)
    assert cfg.source == "jsonl"
    rows, _ = preprocess.read_splits(cfg.model_copy(update={"eval_path": str(f)}))
    tokenized = preprocess.tokenize(rows, str(tiny_model), cfg)
    rejects = tmp_path / "rejects.jsonl"
    kept, counts = preprocess.split_rejects(tokenized, "train", rejects)
    assert (counts.read, counts.kept, counts.rejected) == (24, 20, 4)
    reasons = [json.loads(x)["reason"] for x in rejects.read_text().splitlines()]
    assert len(reasons) == 4
    assert any(r.startswith("bad JSON") for r in reasons)
    assert any("missing field 'answer'" in r for r in reasons)
    assert any("field 'question' is empty" in r for r in reasons)
    assert any(r.startswith("too long") and "data.max_seq_len=128" in r for r in reasons)
    too_long = [json.loads(x) for x in rejects.read_text().splitlines() if "too long" in x][0]
    assert json.loads(too_long["raw"])["question"].startswith("long long")  # which row, not just why
    assert sorted(r["answer"] for r in kept.take_all()) == sorted(str(3 + i) for i in range(20))


def test_all_rows_bad_is_a_clear_error(ray_cluster, tiny_model, tmp_path):
    from raypost.data import DataError, preprocess

    f = tmp_path / "bad.jsonl"
    f.write_text("{oops\n" + json.dumps({"q": 1}) + "\n")
    cfg = DataConfig(path=str(f), eval_path=str(f))
    rows, _ = preprocess.read_splits(cfg)
    with pytest.raises(DataError, match=r"every one of the 2 train rows was rejected"):
        preprocess.split_rejects(preprocess.tokenize(rows, str(tiny_model), cfg), "train", tmp_path / "r.jsonl")


def test_hash_split_is_disjoint(ray_cluster, tmp_path):
    from raypost.data import preprocess

    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) for i in range(400)) + "\n")
    train, evals = preprocess.read_splits(DataConfig(path=str(f), eval_fraction=0.2))
    a, b = {r["id"] for r in train.take_all()}, {r["id"] for r in evals.take_all()}
    assert not a & b and len(a) + len(b) == 400 and 40 < len(b) < 120


def _late_block(batch: dict, late: int) -> dict:
    """A map over range(400) in 4 blocks whose block ``late`` finishes last (a busy node)."""
    import time

    if batch["id"][0] == 100 * late:
        time.sleep(1.5)
    return batch


def test_the_prompt_order_does_not_depend_on_which_block_finished_first(ray_cluster):
    """A resumed run skips a cursor's worth of its seeded prompt order, rebuilt from freshly
    prepared rows: that order must not depend on which block of the preparation finished first."""
    import ray

    from raypost.data import preprocess
    from raypost.utils.cluster import configure_ray_data

    configure_ray_data()

    def order(late: int) -> list[int]:
        prepared = (
            ray.data.range(400, override_num_blocks=4)
            .map_batches(_late_block, fn_kwargs={"late": late}, batch_format="numpy")
            .materialize()
        )
        assert [r["id"] for r in prepared.iter_rows()] == list(range(400))
        return [r["id"] for r in preprocess.epoch_order(prepared, 2, seed=0).iter_rows()]

    first = order(late=0)
    assert sorted(first[:400]) == sorted(first[400:]) == list(range(400)) and first[:400] != first[400:]
    assert order(late=3) == first


def test_parquet_source(ray_cluster, tmp_path):
    from raypost.data import preprocess

    pd.DataFrame({"question": ["a", "b", ""], "answer": ["#### 1", "#### 2", "#### 3"]}).to_parquet(
        tmp_path / "d.parquet"
    )
    cfg = DataConfig(path=str(tmp_path / "d.parquet"), eval_path=str(tmp_path / "d.parquet"))
    assert cfg.source == "parquet"
    rows, _ = preprocess.read_splits(cfg)
    got = sorted((r["question"], r["reject"] != "") for r in rows.take_all())
    assert got == [("", True), ("a", False), ("b", False)]


def test_noisy_demos_change_the_sft_target_not_the_gold(ray_cluster):
    from raypost.data import preprocess

    clean = synthetic.generate(400, seed=5, max_operand=10)
    noisy = synthetic.generate(400, seed=5, max_operand=10, prefix="train", guess_fraction=0.5)
    assert [r["question"] for r in clean] == [r["question"] for r in noisy]  # same problems
    demos = [r for r in noisy if "demo" in r]
    assert 150 < len(demos) < 250
    assert synthetic.guess("Ava has 12 pens. Ava buys 3 more pens.") == "#### 12"

    cfg = DataConfig(synthetic={"num_train": 400, "seed": 5, "num_eval": 50, "guess_fraction": 0.5})
    train, evals = preprocess.read_splits(cfg)
    by_id = {r["id"]: r for r in train.take_all()}
    assert len(by_id) == 400
    for row in noisy:
        got = by_id[row["id"]]
        assert got["answer"] == final_answer(row["answer"])  # gold: the true result
        assert got["solution"] == row.get("demo", row["answer"])  # SFT target: the demo where there is one
    assert all("\n#### " in r["solution"] for r in evals.take_all())  # held-out rows keep worked solutions
