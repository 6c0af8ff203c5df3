"""The GPU run in miniature, compiled (tests/gpu_miniature.py, docs/gpu.md): ``bench --preset qwen3-8b --compile`` by
the preset's hub ids, offline, with a prompt that takes the decode past the old 1,024-row static cache. Its own file
so that ``--dist loadfile`` can run it beside the rest of the miniature (tests/test_gpu_miniature.py, whose
fixtures and helpers it shares)."""
import json

import pytest

from test_gpu_miniature import (check_lossless_with_acceptance, jetflow_cli, long_question, root,  # noqa: F401
                                rows_of, tokenizer, write_data)


@pytest.mark.slow  # torch.compile on the CPU: 1-2 minutes of CPU time (target and head graphs)
def test_compiled_bench_decodes_past_1024_rows_and_equals_ar(root, tokenizer, tmp_path):
    # 1,040 prompt tokens: the whole decode stays in one head-context bucket (1,024-1,280), so one graph per head
    data = write_data(tmp_path / "data", gsm8k_question=long_question(tokenizer, 1040))
    done = jetflow_cli(root, "bench", "--preset", "qwen3-8b", "--device", "cpu", "--dtype", "float32",
                       "--datasets", "gsm8k", "--limit", "1", "--max-new-tokens", "24", "--budgets", "15",
                       "--compile", "--json", data=data)
    check_lossless_with_acceptance(rows_of(done), datasets=1)
    prompt = json.loads((data / "gsm8k/test.jsonl").read_text())["question"] + \
        "\nPlease reason step by step, and put your final answer within \\boxed{}."
    chat = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    assert len(tokenizer(chat, add_special_tokens=False)["input_ids"]) + 24 > 1024  # past the old static cache
