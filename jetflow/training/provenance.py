"""Where a trained head comes from: its provenance files.

``write_provenance`` writes a trained head's ``provenance.json`` and ``PROVENANCE.md``: the
command that rebuilds it (``config.command_for``, generated from the config's flag metadata), the
commands of the heads it was warm-started from, its data file (sha256, mix, the regenerate command),
token counts, wall time, versions and its final evaluation.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
import torch
import transformers

from jetflow.data.regenerate import data_files
from jetflow.util.paths import portable_path
from .config import command_for, lineage, portable_config
from .run import Progress, TrainingRun

TAU_NOTE = ("simulated tau = 1 + sum_k prod_{i<=k} acc_i: tokens per round incl. the bonus token for a chain "
            "of the argmax at every depth (a budget of D = Q-1 draft nodes, root excluded)")


def write_provenance(run: TrainingRun, state: Progress, last: dict, rows: list[dict]) -> dict:
    """out/provenance.json and PROVENANCE.md: command, data, tokens, time, config, results, versions."""
    cfg, path = run.cfg, Path(run.cfg.data)
    files = data_files(path, cfg.parts)
    data = {"file": path.name, "path": portable_path(path), **({"parts": [f.name for f in files]} if path.is_dir() else {}),
            "sha256": run.data_sha256, "sequences": len(rows),
            "train_sequences": len(run.train_seqs), "eval_sequences": len(run.eval_seqs),
            "mix": dict(Counter(str(r["id"]).split(":")[0] for r in rows).most_common()),
            **({"holdout_ids": run.holdout_ids} if run.holdout_ids else {})}  # never trained on (train --holdout)
    meta = files[0].with_name(files[0].name + ".meta.json")  # written by `python -m jetflow regenerate`
    data["command"] = json.loads(meta.read_text()).get("command") if meta.is_file() else None
    prov = {"command": command_for(cfg), "lineage": lineage(cfg), "data": data, "tokens": state.tokens, "steps": state.step,
            "wall_time_s": round(state.elapsed_s, 1), "seed": cfg.seed, "config": portable_config(cfg),
            "final": {"acc": last["acc"], "sim_tau": last["sim_tau"], "eval_step": last["step"]},
            "tau_convention": TAU_NOTE, "versions": {"torch": torch.__version__,
                                                     "transformers": transformers.__version__,
                                                     "python": sys.version.split()[0]}}
    (run.out / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    acc = prov["final"]["acc"]
    (run.out / "PROVENANCE.md").write_text("\n".join([
        "# Draft head training run", "",
        *(["Warm-started (`--init`) from a head that these commands train, oldest first:", "", "```",
           *prov["lineage"], "```", ""] if prov["lineage"] else []),
        "Reproduce with:", "", "```", prov["command"], "```", "",
        *([f"The data file comes from (`JETFLOW_DATA_DIR` names the prompt sets; outputs of batched bf16 "
           f"greedy decoding can differ in rare tokens between machines):", "", "```", data["command"], "```", ""]
          if data["command"] else []),
        f"- data: `{data['file']}` (sha256 `{data['sha256']}`), {data['sequences']} sequences "
        f"({data['train_sequences']} trained on, {data['eval_sequences']} held out); mix {data['mix']}",
        f"- tokens: {state.tokens}",
        f"- {state.step} steps, {prov['wall_time_s']} s wall time, seed {cfg.seed}",
        f"- versions: {prov['versions']}",
        f"- simulated tau **{last['sim_tau']:.3f}** at step {last['step']} ({TAU_NOTE})", "",
        "| depth | " + " | ".join(map(str, range(1, len(acc) + 1))) + " |", "|---|" + "---|" * len(acc),
        "| accuracy | " + " | ".join(f"{a:.3f}" for a in acc) + " |", "",
        "Config:", "", "```json", json.dumps(prov["config"], indent=2), "```", ""]))
    return prov
