"""Acceptance profiles: the vectorized counts against loop references, monotone rates, files, loading; the
hold-out draws (jetflow.data.holdout) and the diagnosis rows and profile command (jetflow.results.diagnose)."""
import math

import pytest
import torch

from jetflow.data import holdout
from jetflow.drafting import profile as pf
from jetflow.results import diagnose as dg
from jetflow.drafting.methods import make_proposer
from jetflow.training.train import build_head
from jetflow.training.config import TrainConfig


def random_drafts(a, d, k, vocab, seed):
    """(A, D, K) drafted ids (distinct per row, sorted "best first") and descending log-probs, plus an
    answer of a + 1 tokens drawn so the truth is often, not always, among the drafts."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(a * d)]).view(a, d, k)
    logp = (-torch.rand(a, d, k, generator=g) * 8).sort(-1, descending=True).values
    tokens = torch.randint(0, vocab, (a + 1,), generator=g).tolist()
    return ids, logp, tokens


def ref_ranks(ids, tokens):
    a, d, k = ids.shape
    out = torch.full((a, d), -1, dtype=torch.long)
    for i in range(a):
        for j in range(d):
            if i + j + 1 < len(tokens):
                row = ids[i, j].tolist()
                out[i, j] = row.index(tokens[i + j + 1]) if tokens[i + j + 1] in row else k
    return out


@pytest.mark.parametrize("seed", range(3))
def test_truth_ranks_and_states_match_loops(seed):
    ids, _, tokens = random_drafts(12, 4, 5, 9, seed)
    ranks = pf.truth_ranks(ids, tokens)
    assert torch.equal(ranks, ref_ranks(ids, tokens))
    reached, off, after = pf.path_states(ranks, 3)
    for i in range(12):
        for j in range(4):
            above = ranks[i, :j].tolist()
            assert reached[i, j] == (ranks[i, j] >= 0 and all(0 <= r < 3 for r in above))
            assert off[i, j] == any(r > 0 for r in above)
            assert after[i, j] == (j > 0 and above[-1] > 0)


def test_counts_match_a_loop_over_anchors():
    ids, logp, tokens = random_drafts(40, 3, 6, 8, 1)
    counts = pf.Counts(3, 4)
    counts.add(logp, ids, tokens)
    ranks = ref_ranks(ids, tokens).tolist()
    reached = torch.zeros(3, 3, dtype=torch.long)
    hits = torch.zeros(3, 3, 4, dtype=torch.long)
    bins = torch.zeros(2, 3, len(pf.EDGES), dtype=torch.long)
    for i, row in enumerate(ranks):
        for j, r in enumerate(row):
            above = row[:j]
            if r < 0 or not all(0 <= x < 4 for x in above):
                continue
            states = [1 if any(x > 0 for x in above) else 0] + ([2] if j and above[-1] > 0 else [])
            for s in states:
                reached[s, j] += 1
                if r < 4:
                    hits[s, j, r] += 1
            for c in range(4):  # every candidate of rank < R lands in its log-prob bin
                b = sum(1 for e in pf.EDGES[:-1] if logp[i, j, c].item() >= e)
                bins[states[0], j, b] += 1
    assert torch.equal(counts.reached, reached) and torch.equal(counts.hits, hits)
    assert torch.equal(counts.bin_total, bins)
    assert counts.bin_hits.sum() == hits[:2].sum()


def test_profile_rates_are_monotone_and_survive_a_round_trip(tmp_path):
    counts = pf.Counts(3, 4)
    for seed in range(3):
        ids, logp, tokens = random_drafts(60, 3, 4, 5, seed)
        counts.add(logp, ids, tokens)
    prof = counts.profile()
    assert (prof.rank.diff(dim=-1) <= 0).all() and (prof.calibrated.diff(dim=-1) >= 0).all()
    assert prof.rank.max() <= 1 and prof.calibrated.max() <= 1 and prof.edges[0] == -math.inf
    path = pf.save_profile(prof, counts, tmp_path, {"command": "python -m jetflow profile"})
    back = pf.load_profile(tmp_path)
    assert path.name == pf.PROFILE_FILE
    for name in ("rank", "edges", "calibrated"):
        assert torch.allclose(getattr(back, name), getattr(prof, name))
    assert pf.load_profile(tmp_path / "missing") is None


def test_calibrate_reads_the_bin_of_each_log_prob():
    prof = pf.Counts(2, 2).profile()   # no data: every bin reads as its own middle probability
    logp = torch.tensor([[-20.0, -0.01], [-1.1, -0.6]])
    got = prof.calibrate(logp, 0).exp()
    lo = (pf.EDGES[0] - 2.0,) + pf.EDGES[:-1]
    mid = lambda b: math.exp((lo[b] + pf.EDGES[b]) / 2)
    want = [mid(0), mid(len(pf.EDGES) - 1), mid(pf.EDGES.index(-1.0)), mid(pf.EDGES.index(-0.5))]  # bins by upper edge
    assert got.flatten().tolist() == pytest.approx(want, rel=1e-5)


def test_make_proposer_loads_the_profile_beside_the_head(tiny_target, tmp_path):
    build_head(TrainConfig(block_size=4), tiny_target).save_pretrained(tmp_path)
    assert make_proposer("jetflow-cal", tiny_target, head=str(tmp_path)).profile is None
    counts = pf.Counts(3, 4)
    pf.save_profile(counts.profile(), counts, tmp_path, {"command": "test"})
    proposer = make_proposer("jetflow-cal+lookup", tiny_target, head=str(tmp_path))
    assert torch.equal(proposer.inner.profile.calibrated, pf.load_profile(tmp_path).calibrated)


def test_diagnosis_rows_report_spine_and_off_spine_rates():
    # depth 1: the truth is rank 0 on 3 anchors and rank 1 on 1; depth 2: the argmax is right only on the spine
    ranks_of = [[0, 0], [0, 0], [0, 0], [1, 2]]
    ids = torch.zeros(4, 2, 3, dtype=torch.long)
    tokens = [9, 10, 11, 12, 13, 14]
    for i, row in enumerate(ranks_of):
        for j, r in enumerate(row):
            ids[i, j] = torch.tensor([1, 2, 3])                 # decoys, then the truth at rank r
            ids[i, j, r] = tokens[i + j + 1]
    counts = pf.Counts(2, 3)
    counts.add(torch.zeros(4, 2, 3), ids, tokens)
    rows = {(r["table"], r["state"], r["depth"], r.get("rank")): r for r in dg.diagnosis_rows(counts, "toy", 3)}
    assert rows["spine", "spine", 1, None]["argmax_accept"] == 0.75
    assert rows["spine", "spine", 2, None]["argmax_accept"] == 1.0 and rows["spine", "spine", 2, None]["reached"] == 3
    assert rows["spine", "after_sibling", 2, None]["argmax_accept"] == 0.0
    assert rows["heatmap", "off_spine", 2, 2]["accept"] == 1.0
    assert "after_sibling" in dg.diagnosis_markdown(list(rows.values()))


def test_corrected_ranks_equal_a_loop():
    """The rank of the true token in its true parent's corrected row, by a loop over anchors and depths."""
    g = torch.Generator().manual_seed(0)
    a, d, c = 6, 4, 3
    paths = torch.randn(a, d - 1, c, c, generator=g)
    ranks = torch.randint(-1, c + 2, (a, d), generator=g)
    got = pf.corrected_ranks(paths, ranks)
    for i in range(a):
        assert got[i, 0] == min(ranks[i, 0], c)
        for j in range(1, d):
            parent, child = ranks[i, j - 1].item(), ranks[i, j].item()
            if child < 0:
                want = -1
            elif not (0 <= parent < c and child < c):
                want = c
            else:
                row = paths[i, j - 1, parent].tolist()
                want = sorted(row, reverse=True).index(row[child])
            assert got[i, j] == want, (i, j)


def test_holdout_prompts_are_the_rows_training_kept_out_and_the_head_must_say_so(tmp_path):
    """`profile --data` answers the prompts of the rows `train --holdout` never trained on, and refuses a head
    whose provenance does not list exactly them."""
    import json
    from jetflow.data.prompts import training_pool
    pool = training_pool(data_dir="fixtures")
    rows = [{"id": p["id"], "prompt_ids": [1, 2], "response_ids": [3, 4]} for p in pool[:10]]
    data = tmp_path / "regen.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [{"settings": {}}] + rows))
    prompts = holdout.holdout_prompts(data, 3, data_dir="fixtures")
    assert {p["id"] for p in prompts} == {rows[i]["id"] for i in (0, 3, 6)} and all(p["prompt"] for p in prompts)
    head = tmp_path / "head"
    head.mkdir()
    with pytest.raises(ValueError, match="lists 0 held-out ids"):
        holdout.check_holdout(head, {p["id"] for p in prompts})
    (head / "provenance.json").write_text(json.dumps({"data": {"holdout_ids": [rows[i]["id"] for i in (0, 3, 6)]}}))
    holdout.check_holdout(head, {p["id"] for p in prompts})
    with pytest.raises(ValueError, match="not trained with these 2 rows"):
        holdout.check_holdout(head, {rows[0]["id"], rows[3]["id"]})


def test_heldout_traces_answer_the_heads_own_holdout_when_it_has_one(tiny_target, tmp_path, monkeypatch):
    """The heldout diagnosis of a head trained with --holdout answers the prompts its provenance lists (pool
    order, the first n), greedy and cached where `profile --data` caches them."""
    import json
    from jetflow.data.prompts import training_pool
    monkeypatch.setenv("JETFLOW_CACHE", str(tmp_path / "cache"))
    pool = training_pool(data_dir="fixtures")
    kept = [p["id"] for p in pool[3:8]]
    head = tmp_path / "head"
    head.mkdir()
    (head / "provenance.json").write_text(json.dumps({"data": {"holdout_ids": kept}}))
    traces = dg.heldout_traces(tiny_target, 2, 4, data_dir="fixtures", head=head)
    assert [t.id for t in traces] == [i for i in kept if i in {t.id for t in traces}][:2] and len(traces) == 2
    assert {t.dataset for t in traces} == {"heldout"} and set(t.id for t in traces) <= set(kept)
    assert holdout.holdout_answers(set(kept), 4).is_file()


def test_holdout_prompts_need_the_last_part(tmp_path):
    """While later parts are still to regenerate, the last file present holds no held-out rows: a clear error."""
    import json
    folder = tmp_path / "regen"
    folder.mkdir()
    rows = [{"id": f"gsm8k-train:{i}", "prompt_ids": [1], "response_ids": [2, 3]} for i in range(5)]
    (folder / "part-00-of-02.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [{"settings": {}}] + rows))
    with pytest.raises(ValueError, match="not the last part"):
        holdout.holdout_prompts(folder, 2, data_dir="fixtures")


def test_profile_command_records_folders_as_any_machine_reads_them(tmp_path, monkeypatch):
    """--out / --head / --data of the recorded command: repository-relative or under the cache folder, never
    this machine's absolute path; a hub id (no such folder) is kept as given."""
    from jetflow.util.paths import REPO as REPO_ROOT
    monkeypatch.setenv("JETFLOW_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "work" / "head").mkdir(parents=True)
    line = dg.profile_command(dg.ProfileConfig(out=str(tmp_path / "cache" / "work" / "head"), head="org/hub-head",
                                               data=str(REPO_ROOT / "data" / "heads")))
    assert "--out '$JETFLOW_CACHE/work/head'" in line and "--head org/hub-head" in line
    assert "--data data/heads" in line and str(tmp_path) not in line
